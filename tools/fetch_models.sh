#!/usr/bin/env bash
# Fetches the PP-OCR models from the rapidocr-onnxruntime wheel on PyPI and checks their
# sha256. Usage: tools/fetch_models.sh [DIR]   (default target/models)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-${CARGO_TARGET_DIR:-target}/models}"
# Any Python with pip does (pip download and zipfile only): the test venv, the bench venv or
# the system's, so that every tool script works on a fresh clone.
target="${CARGO_TARGET_DIR:-target}"
py=python3
for candidate in "$target/venv/bin/python" "$target/bench-venv/bin/python"; do
    if [[ -x "$candidate" ]]; then
        py="$candidate"
        break
    fi
done
wheel=rapidocr_onnxruntime-1.4.4-py3-none-any.whl

# name sha256 (computed once from the files in the 1.4.4 wheel)
models=(
    "ch_PP-OCRv4_det_infer.onnx d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"
    "ch_PP-OCRv4_rec_infer.onnx 48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"
    "ch_ppocr_mobile_v2.0_cls_infer.onnx e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"
)
wheel_sha256=971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf

sha_ok() { [[ -f "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$2" ]]; }

all_ok=true
for entry in "${models[@]}"; do
    read -r name sha <<<"$entry"
    sha_ok "$dir/$name" "$sha" || all_ok=false
done
if $all_ok; then
    exit 0
fi

mkdir -p "$dir"
if ! sha_ok "$dir/$wheel" "$wheel_sha256"; then
    echo "fetch_models: downloading rapidocr-onnxruntime==1.4.4"
    "$py" -m pip --version >/dev/null 2>&1 || {
        echo "fetch_models: $py has no pip; install python3-pip or run tools/setup.sh" >&2
        exit 1
    }
    rm -f "$dir/$wheel"
    "$py" -m pip download --quiet --disable-pip-version-check --no-deps \
        -d "$dir" rapidocr-onnxruntime==1.4.4
    sha_ok "$dir/$wheel" "$wheel_sha256" || {
        echo "fetch_models: $dir/$wheel does not have the expected sha256" >&2
        exit 1
    }
fi
for entry in "${models[@]}"; do
    read -r name sha <<<"$entry"
    sha_ok "$dir/$name" "$sha" && continue
    "$py" - "$dir/$wheel" "rapidocr_onnxruntime/models/$name" "$dir/$name" <<'PY'
import sys, zipfile
wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, open(dest + ".part", "wb") as f:
    f.write(z.read(member))
PY
    mv "$dir/$name.part" "$dir/$name"
    sha_ok "$dir/$name" "$sha" || {
        echo "fetch_models: $dir/$name does not have the expected sha256" >&2
        exit 1
    }
    echo "fetch_models: extracted $name"
done
