"""Float16 exports of two real models, as apps ship them for GPUs and NPUs, for the tests:

    320n_f16.onnx      nudenet's YOLOv8n detector (target/models/320n.onnx)
    prefill_f16.onnx   the decoder fixture's prefill graph (target/decoder/prefill.onnx): a
                       small transformer (LayerNormalization, attention, GELU)

Every float tensor of the graph, inputs and outputs included, becomes float16, converted by the
converter ONNX Runtime ships (`onnxruntime.transformers.float16`, a copy of
onnxconverter-common's, which keeps the operands that must stay float32, such as Resize's
scales; it appends the casts it adds at the end of the graph, which leaves the nodes out of
topological order, as such converted models ship). Writes OUT (default target/models); skipped when every output exists and is newer
than its source and this script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx
from onnxruntime.transformers.float16 import convert_float_to_float16


def fresh(out: Path, *sources: Path) -> bool:
    return out.exists() and all(
        out.stat().st_mtime >= s.stat().st_mtime for s in (*sources, Path(__file__))
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("target/models"))
    ap.add_argument("--decoder", type=Path, default=Path("target/decoder/prefill.onnx"))
    args = ap.parse_args()
    for src, name in [(args.models / "320n.onnx", "320n_f16.onnx"), (args.decoder, "prefill_f16.onnx")]:
        out = args.models / name
        if fresh(out, src):
            continue
        half = convert_float_to_float16(onnx.load(src), keep_io_types=False)
        onnx.save(half, out)
        print(f"make_half_models: {out}")


if __name__ == "__main__":
    main()
