"""The decoder fixture's prefill graph (tools/make_decoder.py) as older exporters write a
transformer, for the tests: opset 14, so no LayerNormalization or Gelu op, each written out
the way a common exporter spells it:

    prefill_exported.onnx   each layer's first LayerNormalization as TorchScript exports
                            nn.LayerNorm below opset 17 (ReduceMean, Sub, Pow 2, ReduceMean,
                            Add eps, Sqrt, Div, Mul gamma, Add beta), the second as tf2onnx
                            does (d * d, Sqrt, Reciprocal, Mul), the final one an RMSNorm as
                            LLaMA-style models write it (no mean, no beta); the MLP's Relu
                            replaced by GELU, exact in layer 0 (PyTorch's Div by sqrt 2, Erf,
                            Add 1, Mul, Mul 0.5) and its tanh form in layer 1 (GPT-2's gelu_new
                            with Pow 3)

Writes them to OUT (default target/models); make_model_references.py writes their cases.
Deterministic, and skipped when every output exists and is newer than its source and this
script.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from make_quantized_models import run
from onnx import helper, numpy_helper


def exported(src: Path, out: Path) -> None:
    m = onnx.load(src)
    g = m.graph
    nodes: list[onnx.NodeProto] = []
    consts: dict[str, onnx.TensorProto] = {}
    count = iter(range(10_000))

    def const(value: float) -> str:
        name = f"c{value!r}"
        consts.setdefault(name, numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    def op(kind: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or f"x{next(count)}"
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def mean(x: str) -> str:
        return op("ReduceMean", [x], axes=[-1], keepdims=1)

    def layer_norm(n: onnx.NodeProto, form: str) -> None:
        x, gamma, beta = n.input
        eps = next(a.f for a in n.attribute if a.name == "epsilon")
        d = x if form == "rms" else op("Sub", [x, mean(x)])
        square = op("Mul", [d, d]) if form == "tf" else op("Pow", [d, const(2.0)])
        s = op("Sqrt", [op("Add", [mean(square), const(eps)])])
        y = op("Div", [d, s]) if form == "torch" else op("Mul", [d, op("Reciprocal", [s])])
        if form == "rms":
            op("Mul", [gamma, y], n.output[0])
        else:
            op("Add", [op("Mul", [y, gamma]), beta], n.output[0])

    def gelu(n: onnx.NodeProto, form: str) -> None:
        (x,) = n.input
        if form == "erf":
            e = op("Add", [op("Erf", [op("Div", [x, const(math.sqrt(2.0))])]), const(1.0)])
            op("Mul", [op("Mul", [x, e]), const(0.5)], n.output[0])
        else:
            inner = op("Add", [x, op("Mul", [op("Pow", [x, const(3.0)]), const(0.044715)])])
            t = op("Tanh", [op("Mul", [inner, const(math.sqrt(2.0 / math.pi))])])
            op("Mul", [op("Mul", [x, const(0.5)]), op("Add", [t, const(1.0)])], n.output[0])

    norms = iter(["torch", "tf"] * 2 + ["rms"])
    gelus = iter(["erf", "tanh"])
    for n in g.node:
        if n.op_type == "LayerNormalization":
            layer_norm(n, next(norms))
        elif n.op_type == "Relu":
            gelu(n, next(gelus))
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(consts.values())
    # The final norm is an RMSNorm: its beta goes unread.
    read = {i for n in g.node for i in n.input}
    kept = [t for t in g.initializer if t.name in read]
    del g.initializer[:]
    g.initializer.extend(kept)
    del m.opset_import[:]
    m.opset_import.append(helper.make_opsetid("", 14))
    onnx.checker.check_model(m)
    onnx.save(m, out)


def main() -> None:
    makers_of = lambda decoder: {"prefill_exported.onnx": lambda o: exported(decoder, o)}
    run(__doc__, makers_of, Path(__file__))


if __name__ == "__main__":
    main()
