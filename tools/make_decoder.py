"""A small decoder-only transformer as two ONNX graphs with separate copies of one set of
weights (issue 6's fixture), and ONNX Runtime's outputs for a prefill then a decode step.

prefill.onnx: input_ids int64 [1, 16] -> logits [1, 16, V], present_{key,value}_L [1, 4, 16, 16]
decode.onnx:  input_ids int64 [1, 1], past_{key,value}_L [1, 4, 16, 16]
              -> logits [1, 1, V], present_{key,value}_L [1, 4, 17, 16]

The two files name their initializers differently (`prefill.` / `decode.` prefixes), as two
separate exports would: a bundle can only store the weights once by comparing content.
Everything is seeded; the inputs and outputs are written as .npy beside the models, with
manifest.json (sizes, each file's initializer bytes, each array's dtype and shape).
"""

import argparse
import hashlib
import json
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

VOCAB, HIDDEN, LAYERS, HEADS, SEQ = 256, 64, 2, 4, 16
HEAD = HIDDEN // HEADS
MLP = 4 * HIDDEN


def weights():
    rng = np.random.default_rng(1234)
    w = lambda *shape: (rng.standard_normal(shape) * 0.05).astype(np.float32)
    out = {"wte": w(VOCAB, HIDDEN), "wpe": w(SEQ + 1, HIDDEN), "lm_head": w(HIDDEN, VOCAB)}
    out["ln_f.g"] = (1 + w(HIDDEN)).astype(np.float32)
    out["ln_f.b"] = w(HIDDEN)
    for l in range(LAYERS):
        for name, shape in [("q", (HIDDEN, HIDDEN)), ("k", (HIDDEN, HIDDEN)),
                            ("v", (HIDDEN, HIDDEN)), ("o", (HIDDEN, HIDDEN)),
                            ("fc1", (HIDDEN, MLP)), ("fc2", (MLP, HIDDEN))]:
            out[f"l{l}.{name}.w"] = w(*shape)
            out[f"l{l}.{name}.b"] = w(shape[1])
        for ln in ("ln1", "ln2"):
            out[f"l{l}.{ln}.g"] = (1 + w(HIDDEN)).astype(np.float32)
            out[f"l{l}.{ln}.b"] = w(HIDDEN)
    return out


def graph(kind, params):
    """kind: 'prefill' (SEQ tokens, no past) or 'decode' (1 token after SEQ of past)."""
    seq = SEQ if kind == "prefill" else 1
    start = 0 if kind == "prefill" else SEQ
    p = f"{kind}."  # this file's initializer names
    nodes, inits = [], []

    def init(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), p + name))
        return p + name

    for name, value in params.items():
        init(name, value)
    ints = lambda name, v: init(name, np.array(v, dtype=np.int64))
    n = iter(range(10_000))
    def op(kind_, inputs, **attrs):
        out = f"t{next(n)}"
        nodes.append(helper.make_node(kind_, inputs, [out], **attrs))
        return out

    positions = ints("positions", [list(range(start, start + seq))])
    x = op("Add", [op("Gather", [p + "wte", "input_ids"]), op("Gather", [p + "wpe", positions])])
    split_heads = ints("split_heads", [1, seq, HEADS, HEAD])
    merge_heads = ints("merge_heads", [1, seq, HIDDEN])
    scale = init("scale", np.array(1.0 / np.sqrt(HEAD), dtype=np.float32))
    mask = None
    if kind == "prefill":
        causal = np.triu(np.full((SEQ, SEQ), -1e9, dtype=np.float32), k=1)
        mask = init("causal_mask", causal)
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])]
    outputs = []
    for l in range(LAYERS):
        w = lambda name: f"{p}l{l}.{name}"
        h = op("LayerNormalization", [x, w("ln1.g"), w("ln1.b")], axis=-1, epsilon=1e-5)
        heads = lambda t: op("Transpose", [op("Reshape", [t, split_heads])], perm=[0, 2, 1, 3])
        proj = lambda t, name: op("Add", [op("MatMul", [t, w(f"{name}.w")]), w(f"{name}.b")])
        q, k, v = heads(proj(h, "q")), heads(proj(h, "k")), heads(proj(h, "v"))
        if kind == "decode":
            past = [f"past_key_{l}", f"past_value_{l}"]
            for name in past:
                inputs.append(helper.make_tensor_value_info(
                    name, TensorProto.FLOAT, [1, HEADS, SEQ, HEAD]))
            k = op("Concat", [past[0], k], axis=2)
            v = op("Concat", [past[1], v], axis=2)
        total = SEQ if kind == "prefill" else SEQ + 1
        for name, t in [(f"present_key_{l}", k), (f"present_value_{l}", v)]:
            nodes.append(helper.make_node("Identity", [t], [name]))
            outputs.append(helper.make_tensor_value_info(
                name, TensorProto.FLOAT, [1, HEADS, total, HEAD]))
        scores = op("Mul", [op("MatMul", [q, op("Transpose", [k], perm=[0, 1, 3, 2])]), scale])
        if mask is not None:
            scores = op("Add", [scores, mask])
        attn = op("MatMul", [op("Softmax", [scores], axis=-1), v])
        attn = op("Reshape", [op("Transpose", [attn], perm=[0, 2, 1, 3]), merge_heads])
        x = op("Add", [x, proj(attn, "o")])
        h = op("LayerNormalization", [x, w("ln2.g"), w("ln2.b")], axis=-1, epsilon=1e-5)
        x = op("Add", [x, proj(op("Relu", [proj(h, "fc1")]), "fc2")])
    x = op("LayerNormalization", [x, p + "ln_f.g", p + "ln_f.b"], axis=-1, epsilon=1e-5)
    nodes.append(helper.make_node("MatMul", [x, p + "lm_head"], ["logits"]))
    outputs.insert(0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, VOCAB]))
    g = helper.make_graph(nodes, f"decoder_{kind}", inputs, outputs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="ingot tools/make_decoder.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    key = hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:16]
    stamp = out / "key.txt"
    if stamp.exists() and stamp.read_text().strip() == key:
        return
    out.mkdir(parents=True, exist_ok=True)
    params = weights()
    manifest = {"vocab": VOCAB, "hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "seq": SEQ,
                "initializer_bytes": {}, "arrays": {}}
    for kind in ("prefill", "decode"):
        model = graph(kind, params)
        onnx.save(model, out / f"{kind}.onnx")
        manifest["initializer_bytes"][kind] = sum(len(t.raw_data) for t in model.graph.initializer)
    manifest["weight_bytes"] = sum(a.nbytes for a in params.values())  # one copy, shared part

    def save(name, value):
        np.save(out / f"{name}.npy", value)
        manifest["arrays"][name] = f"{value.dtype} {'x'.join(map(str, value.shape))}"

    def run(kind, feeds):
        session = ort.InferenceSession(str(out / f"{kind}.onnx"))
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))

    ids = np.random.default_rng(7).integers(0, VOCAB, size=(1, SEQ), dtype=np.int64)
    prefill = run("prefill", {"input_ids": ids})
    save("prefill_input_ids", ids)
    for name, value in prefill.items():
        save(f"prefill_{name}", value)
    feeds = {"input_ids": prefill["logits"][:, -1:].argmax(-1).astype(np.int64)}
    for l in range(LAYERS):
        feeds[f"past_key_{l}"] = prefill[f"present_key_{l}"]
        feeds[f"past_value_{l}"] = prefill[f"present_value_{l}"]
    save("decode_input_ids", feeds["input_ids"])
    for name, value in run("decode", feeds).items():
        save(f"decode_{name}", value)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    stamp.write_text(key + "\n")
    print(f"make_decoder: {out} (prefill + decode, {LAYERS} layers, vocab {VOCAB})")


if __name__ == "__main__":
    main()
