#!/usr/bin/env bash
# Fetches the real models the tests run from PyPI packages that ship them, and checks their
# sha256: PP-OCR (rapidocr-onnxruntime), silero-vad (its v6 voice activity detector, whose
# graph branches with `If` on the sample rate and on shapes), nudenet (a YOLOv8n detector
# at 320: SiLU after every conv, C2f splits and concats, upsampling, a DFL head) and
# onnx-genai (an opset-24 LLM, as protobuf text; tools/setup.sh writes it as a model).
# Usage: tools/fetch_models.sh [DIR]   (default target/models)
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

sha_ok() { [[ -f "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$2" ]]; }

# fetch SPEC FILE FILE_SHA256 MEMBER_DIR "NAME SHA256 [MEMBER]"...: extracts each model NAME
# from MEMBER_DIR/MEMBER (default: NAME) of FILE, a wheel or a source tarball of PyPI package
# SPEC, downloading FILE only when a model is missing.
fetch() {
    local spec=$1 file=$2 file_sha=$3 member_dir=$4
    shift 4
    local all_ok=true entry name sha member
    for entry in "$@"; do
        read -r name sha member <<<"$entry"
        sha_ok "$dir/$name" "$sha" || all_ok=false
    done
    $all_ok && return 0

    mkdir -p "$dir"
    if ! sha_ok "$dir/$file" "$file_sha"; then
        echo "fetch_models: downloading $spec"
        rm -f "$dir/$file"
        if [[ "$file" == *.whl ]]; then
            "$py" -m pip --version >/dev/null 2>&1 || {
                echo "fetch_models: $py has no pip; install python3-pip or run tools/setup.sh" >&2
                exit 1
            }
            "$py" -m pip download --quiet --disable-pip-version-check --no-deps -d "$dir" "$spec"
        else
            # pip would build a source package to download it: take the file PyPI lists.
            "$py" - "$spec" "$file" "$dir/$file" <<'PY'
import json, sys, urllib.parse, urllib.request
spec, file, dest = sys.argv[1:]
name, version = spec.split("==")
index = f"https://pypi.org/pypi/{name}/json"
releases = json.load(urllib.request.urlopen(index, timeout=60))["releases"]
urls = [u["url"] for u in releases.get(version, []) if u["filename"] == file]
if not urls:
    sys.exit(f"fetch_models: PyPI lists no {file} for {spec}")
urllib.request.urlretrieve(urllib.parse.urljoin(index, urls[0]), dest + ".part")
PY
            mv "$dir/$file.part" "$dir/$file"
        fi
        sha_ok "$dir/$file" "$file_sha" || {
            echo "fetch_models: $dir/$file does not have the expected sha256" >&2
            exit 1
        }
    fi
    for entry in "$@"; do
        read -r name sha member <<<"$entry"
        sha_ok "$dir/$name" "$sha" && continue
        "$py" - "$dir/$file" "$member_dir/${member:-$name}" "$dir/$name" <<'PY'
import sys, tarfile, zipfile
archive, member, dest = sys.argv[1:]
with open(dest + ".part", "wb") as f:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            f.write(z.read(member))
    else:
        with tarfile.open(archive) as t:
            f.write(t.extractfile(member).read())
PY
        mv "$dir/$name.part" "$dir/$name"
        sha_ok "$dir/$name" "$sha" || {
            echo "fetch_models: $dir/$name does not have the expected sha256" >&2
            exit 1
        }
        echo "fetch_models: extracted $name"
    done
}

# name sha256 (computed once from the files in each wheel)
fetch rapidocr-onnxruntime==1.4.4 rapidocr_onnxruntime-1.4.4-py3-none-any.whl \
    971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf \
    rapidocr_onnxruntime/models \
    "ch_PP-OCRv4_det_infer.onnx d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9" \
    "ch_PP-OCRv4_rec_infer.onnx 48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b" \
    "ch_ppocr_mobile_v2.0_cls_infer.onnx e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"

fetch silero-vad==6.2.3 silero_vad-6.2.3-py3-none-any.whl \
    7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8 \
    silero_vad/data \
    "silero_vad.onnx 1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3" \
    "silero_vad_half.onnx 1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769"

fetch nudenet==3.4.2 nudenet-3.4.2-py3-none-any.whl \
    5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331 \
    nudenet \
    "320n.onnx c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"

# A one-layer LLM at opset 24 with seeded weights, as the mobius model builder writes them
# for ONNX GenAI runtimes (a fixture of onnx-genai's engine, in protobuf text): Attention with
# nonpad_kv_seqlen over a static KV cache that TensorScatter updates, RMSNormalization, and
# ONNX Runtime's SkipSimplifiedLayerNormalization. Only the source package ships it.
fetch onnx-genai==0.1.0.dev6 onnx_genai-0.1.0.dev6.tar.gz \
    12f9b54a42b7f7cbf4dd11e60253a3cba2c28aab7443d667e2bb48984c44ed4c \
    onnx_genai-0.1.0.dev6/crates/onnx-genai-engine/tests/fixtures/model-package-cpu/cpu \
    "genai_llm.onnx.textproto ede80e50f4cbea9edf19a83882d961b5e8f1d5c5265791729fde1600d7c85306 model.onnx.textproto"
