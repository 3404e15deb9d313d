"""Writes reference cases of real models beyond PP-OCR for the Rust test `models`.

Each case is a model from target/models (tools/fetch_models.sh) with inputs made here and ONNX
Runtime's outputs, under OUT/<case>/:

    inputs/<name>.npy      the runtime inputs (their shapes are the ones compiled)
    constants/<name>.npy   inputs bound at compile time (`ingot compile --constant-input`)
    outputs/<name>.npy     ONNX Runtime's outputs
    perturbed/<name>.npy   (the PERTURBED cases) ONNX Runtime's outputs for the float inputs
                           moved by one part in 10^7: how far the model's own rounding moves
                           them, which the test takes as the bound of Ingot's difference

OUT/manifest.txt lists the cases, one a line: `case=DIR model=FILE.onnx`.

Cases, each with the capability it covers:
- silero_vad 16 kHz and 8 kHz: an audio model whose 25 `If` nodes branch on the sample
  rate input (bound as a constant, so they fold) and on shapes; the state comes from a first
  chunk, as when the model streams.
- silero_vad_half: the same detector exported without the rate input; its `If`s test shapes.
- yolov8n_320: nudenet's YOLOv8n detector on a 320x320 image: SiLU (`x * Sigmoid(x)`) after
  every conv, which Ingot fuses into the conv, C2f splits and concats, nearest upsampling, the
  DFL head's softmax and box decoding.
- yolov8n_320_nms, yolov8n_320_nms_agnostic: the same detector with NMS in the graph
  (tools/make_detector_models.py: per class on centre boxes, one [K, 6] output; class-agnostic
  on corner boxes, three outputs), so the number of rows K depends on the image: Ingot plans
  them at their bound and returns the rows the run kept.
- yolov8n_320_weights_int8: the detector with int8 conv weights per output channel,
  dequantized in the graph by DequantizeLinear or by Cast/Sub/Mul (tools/make_detector_models.py):
  Ingot's convs read the int8 weights and dequantize them as they load them.
- yolov8n_320_dynamic: the detector through ONNX Runtime's `quantize_dynamic`: every conv a
  DynamicQuantizeLinear, a ConvInteger, a Cast to float and the scales and bias, which Ingot
  runs as a float conv reading the int8 weights. Each layer requantizes its input, so a
  difference of one float32 ulp (SiLU's, whose exp neither runtime computes exactly) can move
  a value to the next level and the next layers carry it on: ONNX Runtime's own outputs move
  by a mean 0.07 (max 7 on coordinates up to 320) when the image moves by one part in 10^7.
  It is a PERTURBED case: compared by mean difference against that movement.
- det_224_weights_int8: PP-OCRv4's text detector made the same way, whose convs are followed by
  learnt scalar affine maps: those fold into the weights' scales, and it runs whole on Vulkan.
- yolov8n_320_f16, decoder_f16: the detector and the decoder's prefill graph in float16
  (tools/make_half_models.py), inputs and outputs included: the steps without an f16 kernel
  compute in float32 and round their outputs to f16, as ONNX Runtime's CPU provider does.
- decoder_dynamic, decoder_dynamic_per_channel, decoder_qdq, decoder_weights_int8,
  decoder_weights_int4: the decoder fixture's prefill graph quantized by
  tools/make_quantized_models.py (dynamic int8 with MatMulInteger, per tensor and per column;
  static QDQ; weight-only int8 dequantized in the graph; weight-only int4 in blocks of 32 as
  ONNX Runtime's MatMulNBitsQuantizer writes it), on seeded token ids.
- gpr_rbf, gpr_rational: scikit-learn Gaussian-process regressors as skl2onnx converts them
  (tools/make_sklearn_models.py), scoring 64 rows: their pairwise distances are a `Scan` over
  the 400 and 300 training samples, more steps than Ingot unrolls, so it runs as a loop at
  run time.
- llama_prefill, llama_decode: a LLaMA-style decoder as an opset-23 exporter writes it
  (tools/make_llama_models.py): RMSNormalization, RotaryEmbedding and one Attention node per
  layer, causal; the decode step attends over a seeded cache and returns present_key/value.
- genai_llm_prefill, genai_llm_decode: onnx-genai's one-layer LLM at opset 24 (a fixture of
  its engine, as the mobius builder writes models for ONNX GenAI runtimes): Attention with
  nonpad_kv_seqlen over a static [1, 16, 16] KV cache that TensorScatter writes at
  write_indices, RMSNormalization and ONNX Runtime's SkipSimplifiedLayerNormalization. The
  prefill writes 3 tokens at row 2 of a seeded cache; the decode step 1 token at row 9.
- decoder_exported: the same graph as older exporters write it (tools/make_exported_models.py:
  LayerNormalization and RMSNorm as their ReduceMean chains in three spellings, GELU in its
  Erf and tanh forms), which Ingot rewrites into whole ops.

The reference is ONNX Runtime's CPU provider with graph optimisations disabled and one thread,
as in make_references.py, whose helpers this script shares. Models with MatMulInteger run with
each one rewritten as the exact int32 product it defines (Cast, Sub the zero points, MatMul
in int32): on x86 CPUs without VNNI, ONNX Runtime multiplies uint8 by int8 with AVX2's
`vpmaddubsw`, whose int16 pair sums saturate (713 of 1024 products of a [16, 64] x [64, 64]
test differ from the exact ones there), so its outputs would depend on the machine. For the
same reason each ConvInteger runs as a float Conv of its operands minus their zero points,
cast to int32 (ONNX Runtime has no int32 Conv): sums of 8-bit products, exact in float32. Skips all work when the manifest was written by this same script for
the same models.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

# The manifest header, freshness check and reference session of PP-OCR's references.
from make_references import (
    manifest_header,
    preprocess,
    reference_session,
    text_image,
    up_to_date,
)


def speech_like(rng: np.random.Generator, samples: int, rate: int) -> np.ndarray:
    """A voiced sound (a pitch with harmonics under a syllable envelope) over noise, [1, N]."""
    t = np.arange(samples) / rate
    pitch = rng.uniform(110, 220)
    voiced = sum(np.sin(2 * np.pi * pitch * k * t + rng.uniform(0, 6)) / k for k in range(1, 8))
    envelope = 0.5 - 0.5 * np.cos(2 * np.pi * t / t[-1])
    x = 0.3 * voiced * envelope + rng.normal(0, 0.01, samples)
    return x[None].astype(np.float32)


def silero(model: str, rate: int | None, seed: int):
    """Inputs for two chunks of a stream: the second is the case, its state the first's."""

    def case(sess: ort.InferenceSession):
        rng = np.random.default_rng(seed)
        samples = 512 if rate in (None, 16000) else 256
        constants = {} if rate is None else {"sr": np.array(rate, np.int64)}
        state = np.zeros((2, 1, 128), np.float32)
        first = {"input": speech_like(rng, samples, rate or 16000), "state": state}
        _, state = sess.run(None, {**first, **constants})
        inputs = {"input": speech_like(rng, samples, rate or 16000), "state": state}
        return inputs, constants

    return model, case


def image(shape: tuple[int, ...], seed: int, dtype=np.float32):
    """A smooth image-like input in [0, 1]: blobs and gradients, no constant areas."""

    def case(_sess: ort.InferenceSession):
        rng = np.random.default_rng(seed)
        n, c, h, w = shape
        y, x = np.mgrid[0:h, 0:w] / max(h, w)
        planes = []
        for _ in range(n * c):
            fx, fy, phase = rng.uniform(2, 9), rng.uniform(2, 9), rng.uniform(0, 6)
            blob = np.sin(fx * x * np.pi + phase) * np.cos(fy * y * np.pi)
            planes.append(0.5 + 0.4 * blob + rng.normal(0, 0.03, (h, w)))
        pixels = np.clip(np.stack(planes).reshape(shape), 0, 1).astype(dtype)
        return {"images": pixels}, {}

    return case


def text_page(h: int, w: int, seed: int):
    """A synthetic page of text as PP-OCR's detector takes it (tools/make_references.py's), so
    that the detector fires: on other images its probability map is about 0 everywhere."""

    def case(_sess: ort.InferenceSession):
        return {"x": preprocess(text_image(np.random.default_rng(seed), h, w), "det")}, {}

    return case


def rows(count: int, features: int, seed: int):
    """Samples to score, [count, features], as the models were fitted on: standard normal."""

    def case(_sess: ort.InferenceSession):
        rng = np.random.default_rng(seed)
        return {"X": rng.standard_normal((count, features)).astype(np.float32)}, {}

    return case


def tokens(seed: int):
    """Token ids of the decoder fixture's vocabulary, [1, 16]."""

    def case(_sess: ort.InferenceSession):
        rng = np.random.default_rng(seed)
        return {"input_ids": rng.integers(0, 256, (1, 16)).astype(np.int64)}, {}

    return case


def decode_step(seed: int):
    """One token after a cache of 16, [1, 1], and seeded caches [1, 4, 16, 16] per layer."""

    def case(sess: ort.InferenceSession):
        rng = np.random.default_rng(seed)
        inputs = {"input_ids": rng.integers(0, 256, (1, 1)).astype(np.int64)}
        for i in sess.get_inputs()[1:]:
            inputs[i.name] = rng.standard_normal(i.shape).astype(np.float32)
        return inputs, {}

    return case


def cached(tokens: int, at: int, seed: int):
    """`tokens` token ids written at row `at` of seeded KV caches, attending to rows 0..at+tokens."""

    def case(sess: ort.InferenceSession):
        rng = np.random.default_rng(seed)
        inputs = {"input_ids": rng.integers(0, 32, (1, tokens)).astype(np.int64)}
        for name in ("key_cache.0", "value_cache.0"):
            inputs[name] = rng.standard_normal((1, 16, 16)).astype(np.float32)
        inputs["write_indices"] = np.array([at], np.int64)
        inputs["nonpad_kv_seqlen"] = np.array([at + tokens], np.int64)
        return inputs, {}

    return case


CASES = {
    "silero_vad_16k": silero("silero_vad.onnx", 16000, 1),
    "silero_vad_8k": silero("silero_vad.onnx", 8000, 2),
    "silero_vad_half": silero("silero_vad_half.onnx", None, 3),
    "yolov8n_320": ("320n.onnx", image((1, 3, 320, 320), 4)),
    "yolov8n_320_nms": ("320n_nms.onnx", image((1, 3, 320, 320), 4)),
    "yolov8n_320_nms_agnostic": ("320n_nms_agnostic.onnx", image((1, 3, 320, 320), 5)),
    "yolov8n_320_f16": ("320n_f16.onnx", image((1, 3, 320, 320), 10, np.float16)),
    "yolov8n_320_weights_int8": ("320n_weights_int8.onnx", image((1, 3, 320, 320), 17)),
    "det_224_weights_int8": ("det_weights_int8.onnx", text_page(224, 224, 18)),
    "yolov8n_320_dynamic": ("320n_dynamic.onnx", image((1, 3, 320, 320), 19)),
    "decoder_f16": ("prefill_f16.onnx", tokens(11)),
    "decoder_dynamic": ("prefill_dynamic.onnx", tokens(5)),
    "decoder_dynamic_per_channel": ("prefill_dynamic_per_channel.onnx", tokens(6)),
    "decoder_qdq": ("prefill_qdq.onnx", tokens(7)),
    "decoder_weights_int8": ("prefill_weights_int8.onnx", tokens(8)),
    "decoder_weights_int4": ("prefill_weights_int4.onnx", tokens(16)),
    "decoder_exported": ("prefill_exported.onnx", tokens(9)),
    "llama_prefill": ("llama_prefill.onnx", tokens(14)),
    "llama_decode": ("llama_decode.onnx", decode_step(15)),
    "genai_llm_prefill": ("genai_llm.onnx", cached(3, 2, 20)),
    "genai_llm_decode": ("genai_llm.onnx", cached(1, 9, 21)),
    "gpr_rbf": ("gpr_rbf.onnx", rows(64, 8, 12)),
    "gpr_rational": ("gpr_rational.onnx", rows(64, 5, 13)),
}


# Cases compared by their mean difference against the model's sensitivity to rounding
# (`perturbed/`), not element by element.
PERTURBED = {"yolov8n_320_dynamic"}


def perturbed(sess: ort.InferenceSession, inputs: dict, constants: dict) -> dict:
    """ONNX Runtime's outputs for the float `inputs` moved by one part in 10^7."""
    rng = np.random.default_rng(99)
    moved = {
        k: (v * (1 + 1e-7 * rng.standard_normal(v.shape))).astype(v.dtype)
        if v.dtype.kind == "f"
        else v
        for k, v in inputs.items()
    }
    outputs = sess.run(None, {**moved, **constants})
    return {o.name: y for o, y in zip(sess.get_outputs(), outputs)}


def exact_conv(n: onnx.NodeProto, nodes: list) -> None:
    """ConvInteger `n` as Cast to float, Sub of the zero points, Conv, Cast to int32."""
    real = []
    for k, x in enumerate(n.input[:2]):
        r = f"{n.output[0]}.real{k}"
        nodes.append(helper.make_node("Cast", [x], [r], to=TensorProto.FLOAT))
        zero = n.input[k + 2] if len(n.input) > k + 2 else ""
        if zero:
            z = f"{r}.zero"
            nodes.append(helper.make_node("Cast", [zero], [z], to=TensorProto.FLOAT))
            if k == 1:  # one per output channel: [M, 1, 1, 1] against W [M, C, kh, kw]
                shape = f"{z}.shape"
                nodes.append(
                    helper.make_node(
                        "Constant",
                        [],
                        [shape],
                        value=helper.make_tensor(shape, TensorProto.INT64, [4], [-1, 1, 1, 1]),
                    )
                )
                nodes.append(helper.make_node("Reshape", [z, shape], [f"{z}.column"]))
                z = f"{z}.column"
            nodes.append(helper.make_node("Sub", [r, z], [f"{r}.centred"]))
            r = f"{r}.centred"
        real.append(r)
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    nodes.append(helper.make_node("Conv", real, [f"{n.output[0]}.sums"], **attrs))
    nodes.append(
        helper.make_node("Cast", [f"{n.output[0]}.sums"], list(n.output), to=TensorProto.INT32)
    )


def exact_integer_products(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every MatMulInteger as Cast to int32, Sub of its zero points, MatMul, and
    every ConvInteger as `exact_conv` writes it."""
    nodes = []
    for n in model.graph.node:
        if n.op_type == "ConvInteger":
            exact_conv(n, nodes)
            continue
        if n.op_type != "MatMulInteger":
            nodes.append(n)
            continue
        wide = []
        for k, x in enumerate(n.input[:2]):
            w = f"{n.output[0]}.wide{k}"
            nodes.append(helper.make_node("Cast", [x], [w], to=TensorProto.INT32))
            zero = n.input[k + 2] if len(n.input) > k + 2 else ""
            if zero:
                z = f"{w}.zero"
                nodes.append(helper.make_node("Cast", [zero], [z], to=TensorProto.INT32))
                nodes.append(helper.make_node("Sub", [w, z], [f"{w}.centred"]))
                w = f"{w}.centred"
            wide.append(w)
        nodes.append(helper.make_node("MatMul", wide, list(n.output)))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("target/models"))
    ap.add_argument("--out", type=Path, default=Path("target/references/models"))
    args = ap.parse_args()

    manifest = args.out / "manifest.txt"
    names = {model for model, _ in CASES.values()}
    header = manifest_header(Path(__file__), args.models, names)
    if up_to_date(manifest, header):
        return

    lines = [header]
    for name, (model, make) in CASES.items():
        sess = reference_session(args.models / model)
        inputs, constants = make(sess)
        loaded = onnx.load(args.models / model)
        if any(n.op_type in ("MatMulInteger", "ConvInteger") for n in loaded.graph.node):
            exact = exact_integer_products(loaded).SerializeToString()
            sess = reference_session(exact)
        outputs = sess.run(None, {**inputs, **constants})
        moved = perturbed(sess, inputs, constants) if name in PERTURBED else {}
        for sub, arrays in [
            ("inputs", inputs),
            ("constants", constants),
            ("outputs", {o.name: y for o, y in zip(sess.get_outputs(), outputs)}),
            ("perturbed", moved),
        ]:
            d = args.out / name / sub
            if not arrays and not d.exists():
                continue
            d.mkdir(parents=True, exist_ok=True)
            for old in d.glob("*.npy"):
                old.unlink()
            for array_name, array in arrays.items():
                np.save(d / f"{array_name}.npy", array)
        lines.append(f"case={name} model={model}")
        print(f"make_model_references: {name} -> {[y.shape for y in outputs]}")
    # Written last: its presence with the right key means everything above is complete.
    manifest.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
