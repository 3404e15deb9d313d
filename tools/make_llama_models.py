"""A small LLaMA-style decoder as an opset-23 exporter writes one, prefill and decode graphs, for
the tests of opset 23's transformer ops:

    llama_prefill.onnx   input_ids int64 [1, 16] -> logits [1, 16, V],
                         present_{key,value}_L [1, 4, 16, 16]
    llama_decode.onnx    input_ids int64 [1, 1], past_{key,value}_L [1, 4, 16, 16]
                         -> logits [1, 1, V], present_{key,value}_L [1, 4, 17, 16]

Each layer: RMSNormalization, Q/K/V projections split into heads, RotaryEmbedding on Q and K
(cos/sin caches, position ids), one `Attention` node (causal; the decode graph hands it the
cache and takes present_key/present_value from it), the output projection, RMSNormalization
and a SiLU-gated MLP; a final RMSNormalization and the LM head. Seeded weights, two
layers. Writes OUT (default target/models); make_model_references.py writes their cases.
Skipped when both outputs exist and are newer than this script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, HIDDEN, LAYERS, HEADS, SEQ, MLP = 256, 64, 2, 4, 16, 128
HEAD = HIDDEN // HEADS
# Rows of the rotary caches: positions 0 to 31.
POSITIONS = 32


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2323)
    w = lambda *shape: (rng.standard_normal(shape) * 0.08).astype(np.float32)
    out = {"wte": w(VOCAB, HIDDEN), "lm_head": w(HIDDEN, VOCAB), "norm": 1 + w(HIDDEN)}
    for l in range(LAYERS):
        for name, shape in [("q", (HIDDEN, HIDDEN)), ("k", (HIDDEN, HIDDEN)),
                            ("v", (HIDDEN, HIDDEN)), ("o", (HIDDEN, HIDDEN)),
                            ("gate", (HIDDEN, MLP)), ("up", (HIDDEN, MLP)),
                            ("down", (MLP, HIDDEN))]:
            out[f"l{l}.{name}"] = w(*shape)
        out[f"l{l}.norm1"] = 1 + w(HIDDEN)
        out[f"l{l}.norm2"] = 1 + w(HIDDEN)
    # LLaMA's frequencies, base 10000, for half the head.
    inv = 1.0 / 10000 ** (np.arange(0, HEAD, 2) / HEAD)
    angles = np.outer(np.arange(POSITIONS), inv)
    out["cos"] = np.cos(angles).astype(np.float32)
    out["sin"] = np.sin(angles).astype(np.float32)
    return out


def graph(kind: str, params: dict[str, np.ndarray]) -> onnx.ModelProto:
    """kind: 'prefill' (SEQ tokens, no cache) or 'decode' (1 token after SEQ cached)."""
    seq = SEQ if kind == "prefill" else 1
    start = 0 if kind == "prefill" else SEQ
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(v, name) for name, v in params.items()]
    count = iter(range(10_000))

    def op(kind_: str, inputs: list[str], outputs: list[str] | None = None, **attrs) -> str:
        outputs = outputs or [f"t{next(count)}"]
        nodes.append(helper.make_node(kind_, inputs, outputs, **attrs))
        return outputs[0]

    def ints(name: str, values) -> str:
        inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    positions = ints("position_ids", [list(range(start, start + seq))])
    split = ints("split_heads", [1, seq, HEADS, HEAD])
    merge = ints("merge_heads", [1, seq, HIDDEN])
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])]
    outputs = []
    x = op("Gather", ["wte", "input_ids"])
    total = start + seq
    for l in range(LAYERS):
        w = lambda name: f"l{l}.{name}"
        h = op("RMSNormalization", [x, w("norm1")], axis=-1, epsilon=1e-5)
        heads = lambda t: op("Transpose", [op("Reshape", [t, split])], perm=[0, 2, 1, 3])
        rotate = lambda t: op("RotaryEmbedding", [t, "cos", "sin", positions])
        q = rotate(heads(op("MatMul", [h, w("q")])))
        k = rotate(heads(op("MatMul", [h, w("k")])))
        v = heads(op("MatMul", [h, w("v")]))
        present = [f"present_key_{l}", f"present_value_{l}"]
        cache: list[str] = []
        if kind == "decode":
            cache = ["", f"past_key_{l}", f"past_value_{l}"]
            for name in cache[1:]:
                inputs.append(helper.make_tensor_value_info(
                    name, TensorProto.FLOAT, [1, HEADS, SEQ, HEAD]))
        attn = op("Attention", [q, k, v, *cache], [f"attn{l}", *present], is_causal=1)
        for name in present:
            outputs.append(helper.make_tensor_value_info(
                name, TensorProto.FLOAT, [1, HEADS, total, HEAD]))
        attn = op("Reshape", [op("Transpose", [attn], perm=[0, 2, 1, 3]), merge])
        x = op("Add", [x, op("MatMul", [attn, w("o")])])
        h = op("RMSNormalization", [x, w("norm2")], axis=-1, epsilon=1e-5)
        gate = op("MatMul", [h, w("gate")])
        silu = op("Mul", [gate, op("Sigmoid", [gate])])
        up = op("Mul", [silu, op("MatMul", [h, w("up")])])
        x = op("Add", [x, op("MatMul", [up, w("down")])])
    x = op("RMSNormalization", [x, "norm"], axis=-1, epsilon=1e-5)
    op("MatMul", [x, "lm_head"], ["logits"])
    outputs.insert(0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, VOCAB]))
    g = helper.make_graph(nodes, f"llama_{kind}", inputs, outputs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)],
                              producer_name="ingot tools/make_llama_models.py")
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("target/models"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).stat().st_mtime
    params = weights()
    for kind in ("prefill", "decode"):
        out = args.out / f"llama_{kind}.onnx"
        if out.exists() and out.stat().st_mtime >= script:
            continue
        onnx.save(graph(kind, params), out)
        print(f"make_llama_models: wrote {out}")


if __name__ == "__main__":
    main()
