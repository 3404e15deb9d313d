#!/usr/bin/env bash
# The Python package's check: builds the wheel with maturin, installs it into the test venv and
# runs python/tests with pytest (PP-OCR cls against ONNX Runtime, plans, errors). Idempotent; run
# from anywhere: bash python/test.sh. The venv and the models come from tools/setup.sh, which runs
# first when either is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
venv="$target/venv"
py="$venv/bin/python"
models="$target/models"

if [[ ! -x "$py" || ! -f "$models/ch_ppocr_mobile_v2.0_cls_infer.onnx" ]]; then
    echo "python/test.sh: no venv or PP-OCR models under $target; running tools/setup.sh"
    bash tools/setup.sh
fi

# The build and test tools, pinned; reinstalled only when a version differs.
pins=(maturin==1.16.0 pytest==9.2.0)
check_pins='
import importlib.metadata as m, sys
want = dict(p.split("==") for p in sys.argv[1:])
sys.exit(any(m.version(n) != v for n, v in want.items()))'
if ! "$py" -c "$check_pins" "${pins[@]}" 2>/dev/null; then
    echo "python/test.sh: installing ${pins[*]} into $venv"
    "$py" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
fi

# The dev profile: the workspace already optimises dependencies and ingot-ops (the kernels), so
# the wheel runs the model quickly and builds in a fraction of a release build's time (thin LTO
# over the whole compiler). A release wheel: maturin build --release --strip -m python/Cargo.toml.
wheels="$target/python-wheels"
rm -rf "$wheels"
"$venv/bin/maturin" build --quiet --manifest-path python/Cargo.toml --interpreter "$py" \
    --out "$wheels"
wheel=$(ls "$wheels"/ingot-*.whl)
"$py" - "$wheel" <<'PY'
import sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    native = [i for i in z.infolist() if "_native" in i.filename]
    so = sum(i.file_size for i in native)
import os
print(f"python/test.sh: {os.path.basename(path)}: {os.path.getsize(path)} bytes "
      f"(extension module {so} bytes unpacked; dev profile, not stripped)")
PY
"$py" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"

# From the repository root, so that `import ingot` finds the installed wheel, not python/ingot/.
INGOT_MODELS="$(cd "$models" && pwd)" "$py" -m pytest -p no:cacheprovider -v python/tests
