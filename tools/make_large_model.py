"""A synthetic model with about GIB GiB of float32 weights, stored as ONNX external data: a
chain of MatMul + Relu over 4096x4096 weights (64 MiB each). For measuring the compiler's
peak memory against the weight bytes (tools/bench_compile.sh)."""

import argparse
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--gib", type=float, default=1.0)
args = ap.parse_args()
out = pathlib.Path(args.out)
out.mkdir(parents=True, exist_ok=True)
n = 4096
layers = max(1, round(args.gib * (1 << 30) / (n * n * 4)))
rng = np.random.default_rng(0)
nodes, inits = [], []
x = "x"
for i in range(layers):
    w = (rng.standard_normal((n, n), dtype=np.float32) * 0.01).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"w{i}"))
    nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
    y = "y" if i == layers - 1 else f"r{i}"
    nodes.append(helper.make_node("Relu", [f"m{i}"], [y]))
    x = y
g = helper.make_graph(nodes, "large", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.save(model, out / "large.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
          location="large.onnx.data")
print(f"{out / 'large.onnx'}: {layers} weights of {n}x{n} f32, {layers * n * n * 4} bytes")
