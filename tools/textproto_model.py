"""Writes an ONNX model that a package ships as protobuf text (tools/fetch_models.sh fetches
onnx-genai's opset-24 LLM so) as the binary model Ingot and ONNX Runtime read:

    textproto_model.py IN.onnx.textproto OUT.onnx

Skipped when OUT exists and is newer than IN.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
from google.protobuf import text_format


def main() -> None:
    src, dest = map(Path, sys.argv[1:3])
    if dest.exists() and dest.stat().st_mtime >= src.stat().st_mtime:
        return
    model = text_format.Parse(src.read_text(), onnx.ModelProto())
    onnx.checker.check_model(model)
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(dest)
    print(f"textproto_model: wrote {dest}")


if __name__ == "__main__":
    main()
