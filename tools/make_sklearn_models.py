"""Writes scikit-learn models as skl2onnx converts them, for the Rust test `models`.

A model a data team brings from scikit-learn reaches ONNX through skl2onnx, whose pairwise
distances (`onnx_cdist`) are a `Scan` over the training set, the rows being scored carried
through unchanged. Trained on more samples than Ingot unrolls a Scan over (256), that Scan
runs as a loop at run time:

- gpr_rbf.onnx: a GaussianProcessRegressor with an RBF kernel plus white noise, on 8
  features, fitted on 400 samples;
- gpr_rational.onnx: one with a RationalQuadratic kernel, on 5 features, fitted on 300.

Both are fitted on seeded synthetic data with their kernels' hyperparameters fixed
(`optimizer=None`), so that the model is the same on any machine. Skips all work when the
models are there and were written by this same script.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, RationalQuadratic, WhiteKernel
from skl2onnx import to_onnx

MODELS = {
    "gpr_rbf.onnx": (8, 400, lambda: RBF(length_scale=2.0) + WhiteKernel(noise_level=0.1)),
    "gpr_rational.onnx": (5, 300, lambda: RationalQuadratic(length_scale=1.5, alpha=0.5)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("target/models"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    stamp = args.out / "sklearn.stamp"
    if stamp.exists() and stamp.read_text() == key and all(
        (args.out / name).exists() for name in MODELS
    ):
        return
    for seed, (name, (features, samples, kernel)) in enumerate(MODELS.items()):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((samples, features)).astype(np.float32)
        y = np.sin(x).sum(axis=1) + 0.1 * rng.standard_normal(samples)
        # alpha: noise on the diagonal, which keeps the weights the prediction sums small.
        model = GaussianProcessRegressor(kernel(), alpha=0.1, optimizer=None).fit(x, y)
        onx = to_onnx(model, x[:1], target_opset=17)
        (args.out / name).write_bytes(onx.SerializeToString())
        print(f"make_sklearn_models: {name}: {len(onx.graph.node)} nodes")
    stamp.write_text(key)


if __name__ == "__main__":
    main()
