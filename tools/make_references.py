"""Writes the PP-OCR reference cases the Rust test `ppocr` compares against.

For each case: a seeded synthetic text image, preprocessed the way PP-OCR preprocesses (det:
ImageNet mean/std, so about [-2.1, 2.6]; rec and cls: (x - 0.5) / 0.5, so [-1, 1]), saved as
input_0.npy, and ONNX Runtime's outputs as output_<i>.npy, under OUT/<model>/<shape>/.
OUT/manifest.txt lists the cases, one a line:

    model=FILE.onnx case=DIR inputs=NAME:1x3x224x224[,...] outputs=NAME[,...]

A synthetic page with dark glyph strokes, rather than noise, makes the detector fire (noise
gives a probability map of ~0 everywhere, which any tolerance would accept).

The reference runs ONNX Runtime's CPU provider with graph optimisations disabled and one
thread: every node is evaluated as the graph writes it (no Conv+BatchNorm folding, no fused
activations, no NCHWc layout transforms, all of which re-round), and the numbers do not depend
on the machine's core count. Measured here, the fused graph (ORT_ENABLE_ALL) differs from it
by at most 1.4e-6 absolute (rec), so either would pass the 1e-4 test tolerance; the unfused
graph is the one that is the model's definition.

Skips all work when the manifest was written by this same script for the same models.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
import onnxruntime as ort

# model file, input height x width, preprocessing, seed
CASES = [
    ("ch_PP-OCRv4_det_infer.onnx", (224, 224), "det", 1),
    ("ch_PP-OCRv4_det_infer.onnx", (160, 256), "det", 2),
    ("ch_PP-OCRv4_rec_infer.onnx", (48, 320), "rec", 3),
    ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (48, 192), "cls", 4),
]


def text_image(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A light page with lines of dark glyph-like strokes and some noise, HxWx3 in 0..255."""
    img = np.full((h, w, 3), rng.uniform(180, 250), np.float32)
    line_h = max(8, h // 6)
    y = int(rng.integers(2, line_h))
    while y + line_h < h:
        x = int(rng.integers(2, max(3, w // 8)))
        x_end = int(rng.integers(w // 2, w))
        while x + line_h // 2 < x_end:
            glyph_w = int(rng.integers(line_h // 3, line_h))
            for _ in range(int(rng.integers(2, 5))):
                ink = rng.uniform(0, 60)
                if rng.random() < 0.5:
                    yy = y + int(rng.integers(0, line_h - 2))
                    img[yy : yy + 2, x : x + glyph_w] = ink
                else:
                    xx = x + int(rng.integers(0, max(1, glyph_w - 2)))
                    img[y : y + line_h, xx : xx + 2] = ink
            x += glyph_w + int(rng.integers(1, line_h // 3 + 2))
        y += line_h + int(rng.integers(line_h // 2, line_h * 2))
    img += rng.normal(0, 6, img.shape).astype(np.float32)
    return np.clip(img, 0, 255)


def preprocess(img: np.ndarray, kind: str) -> np.ndarray:
    x = img / 255.0
    if kind == "det":
        x = (x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    else:
        x = (x - 0.5) / 0.5
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def dims(shape) -> str:
    return "x".join(str(d) for d in shape)


def manifest_header(script: Path, models: Path, names: set[str]) -> str:
    """The first line of a manifest `script` writes: a key over the script, the ONNX Runtime
    and numpy versions and the models, so that a manifest with it is up to date."""
    h = hashlib.sha256(script.read_bytes())
    h.update(ort.__version__.encode() + np.__version__.encode())
    for name in sorted(names):
        h.update((models / name).read_bytes())
    return f"# written by tools/{script.name}, key {h.hexdigest()[:16]}"


def up_to_date(manifest: Path, header: str) -> bool:
    return manifest.exists() and manifest.read_text().startswith(header + "\n")


def reference_session(model: Path | bytes) -> ort.InferenceSession:
    """ONNX Runtime's CPU provider, unoptimised, one thread: the reference (see above), for a
    model file or a serialized model."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("target/models"))
    ap.add_argument("--out", type=Path, default=Path("target/references"))
    args = ap.parse_args()

    manifest = args.out / "manifest.txt"
    header = manifest_header(Path(__file__), args.models, {c[0] for c in CASES})
    if up_to_date(manifest, header):
        return

    lines = [header]
    for model, (h, w), kind, seed in CASES:
        sess = reference_session(args.models / model)
        (inp,) = sess.get_inputs()
        x = preprocess(text_image(np.random.default_rng(seed), h, w), kind)
        outputs = sess.run(None, {inp.name: x})
        case = f"{Path(model).stem}/{dims(x.shape)}"
        case_dir = args.out / case
        case_dir.mkdir(parents=True, exist_ok=True)
        np.save(case_dir / "input_0.npy", x)
        for i, y in enumerate(outputs):
            np.save(case_dir / f"output_{i}.npy", y)
        names = ",".join(o.name for o in sess.get_outputs())
        lines.append(
            f"model={model} case={case} inputs={inp.name}:{dims(x.shape)} outputs={names}"
        )
        print(f"make_references: {case} -> {[y.shape for y in outputs]}")
    # Written last: its presence with the right key means everything above is complete.
    manifest.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
