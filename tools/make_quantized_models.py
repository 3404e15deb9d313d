"""Quantized models for the tests: the decoder fixture's prefill graph (tools/make_decoder.py:
a two-layer transformer with token and position embeddings, attention, a GELU-free MLP and a
language-model head) quantized the ways people quantize models:

    prefill_dynamic.onnx              onnxruntime.quantization.quantize_dynamic, int8 weights
                                      per tensor: DynamicQuantizeLinear, MatMulInteger, the
                                      embeddings Gathered as int8 and then dequantized
    prefill_dynamic_per_channel.onnx  the same with a scale and zero point per weight column
    prefill_qdq.onnx                  quantize_static in QDQ form (calibrated on seeded token
                                      ids): QuantizeLinear/DequantizeLinear around every op,
                                      int8 weights per output channel, int32 biases
    prefill_weights_int8.onnx         weight-only int8 as exporters write it: every matrix
                                      int8 with a float scale per column and dequantized in the
                                      graph, by DequantizeLinear, except the head, dequantized
                                      by a Cast to float and a Mul by its scales (the chain
                                      some exporters write instead), and the token embedding
                                      table int8 per row, dequantized before its Gather
    prefill_weights_int4.onnx         weight-only int4 as ONNX Runtime's MatMulNBitsQuantizer
                                      writes it in QDQ form (opset 21): every matrix int4,
                                      symmetric, a float scale per block of 32 rows of each
                                      column, dequantized in the graph by DequantizeLinear

Writes them to OUT (default target/models); make_model_references.py writes their cases.
Deterministic, and skipped when every output exists and is newer than its source and this
script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def dynamic(src: Path, out: Path, per_channel: bool) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(src, out, weight_type=QuantType.QInt8, per_channel=per_channel)


def qdq(src: Path, out: Path) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Tokens(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(7)
            batches = [rng.integers(0, 256, (1, 16)).astype(np.int64) for _ in range(8)]
            self.batches = iter({"input_ids": b} for b in batches)

        def get_next(self):
            return next(self.batches, None)

    quantize_static(
        src,
        out,
        Tokens(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        weight_type=QuantType.QInt8,
        activation_type=QuantType.QUInt8,
    )


def symmetric(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """int8 values and float32 scales of `w`, one scale per index of `axis`, symmetric."""
    reduce = tuple(a for a in range(w.ndim) if a != axis)
    scale = (np.abs(w).max(axis=reduce) / 127).astype(np.float32)
    scale[scale == 0] = 1
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


def weights_int8(src: Path, out: Path) -> None:
    m = onnx.load(src)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    new_nodes: list[onnx.NodeProto] = []
    replaced: dict[str, str] = {}

    def quantize(name: str, axis: int, chain: bool) -> None:
        w = numpy_helper.to_array(inits[name])
        q, scale = symmetric(w, axis)
        g.initializer.remove(inits[name])
        g.initializer.append(numpy_helper.from_array(q, f"{name}.q"))
        real = f"{name}.dq"
        if chain:
            shape = [1] * w.ndim
            shape[axis] = -1
            g.initializer.append(numpy_helper.from_array(scale.reshape(shape), f"{name}.s"))
            new_nodes.append(
                helper.make_node("Cast", [f"{name}.q"], [f"{name}.f"], to=TensorProto.FLOAT)
            )
            new_nodes.append(helper.make_node("Mul", [f"{name}.f", f"{name}.s"], [real]))
        else:
            g.initializer.append(numpy_helper.from_array(scale, f"{name}.s"))
            new_nodes.append(
                helper.make_node("DequantizeLinear", [f"{name}.q", f"{name}.s"], [real], axis=axis)
            )
        replaced[name] = real

    for name, init in list(inits.items()):
        if init.data_type != TensorProto.FLOAT or len(init.dims) != 2 or name.endswith("pe"):
            continue
        users = readers.get(name, [])
        if name.endswith(".wte"):
            quantize(name, 0, chain=False)
        elif name.endswith("lm_head"):
            quantize(name, 1, chain=True)
        elif users and all(u.op_type == "MatMul" and u.input[1] == name for u in users):
            quantize(name, 1, chain=False)
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in replaced:
                n.input[k] = replaced[i]
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(new_nodes + nodes)
    onnx.checker.check_model(m)
    onnx.save(m, out)


def weights_int4(src: Path, out: Path) -> None:
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    config = DefaultWeightOnlyQuantConfig(
        block_size=32, is_symmetric=True, quant_format=QuantFormat.QDQ
    )
    quantizer = MatMulNBitsQuantizer(onnx.load(src), algo_config=config)
    quantizer.process()
    model = quantizer.model.model if hasattr(quantizer.model, "model") else quantizer.model
    onnx.save(model, out)


def main() -> None:
    run(
        __doc__,
        lambda decoder: {
            "prefill_dynamic.onnx": lambda o: dynamic(decoder, o, per_channel=False),
            "prefill_dynamic_per_channel.onnx": lambda o: dynamic(decoder, o, per_channel=True),
            "prefill_qdq.onnx": lambda o: qdq(decoder, o),
            "prefill_weights_int8.onnx": lambda o: weights_int8(decoder, o),
            "prefill_weights_int4.onnx": lambda o: weights_int4(decoder, o),
        },
        Path(__file__),
    )


def run(doc: str, makers_of, script: Path) -> None:
    """The command line of a script that derives models from the decoder fixture: `makers_of`
    gives, for the fixture's path, each output's name and its maker. Runs each maker whose
    output is missing or older than the fixture or the script, writing beside it and then
    renaming, so that an interrupted run leaves no half-written model."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--decoder", type=Path, default=Path("target/decoder/prefill.onnx"))
    ap.add_argument("--out", type=Path, default=Path("target/models"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sources = [args.decoder, Path(__file__), script]
    newest_source = max(s.stat().st_mtime for s in sources)
    for name, make in makers_of(args.decoder).items():
        out = args.out / name
        if out.exists() and out.stat().st_mtime > newest_source:
            continue
        part = out.with_suffix(".part.onnx")
        make(part)
        part.replace(out)
        print(f"{script.stem}: {out}")


if __name__ == "__main__":
    main()
