"""Detectors as users bring them, made from nudenet's YOLOv8n (target/models/320n.onnx) and
PP-OCRv4's text detector (ch_PP-OCRv4_det_infer.onnx), for the tests. YOLOv8n with its
post-processing in the graph, as detectors are exported with NMS inside:

    320n_nms.onnx           per-class NMS on centre-format boxes (center_point_box = 1) of the
                            head's [1, 4 + C, N] output, then the kept rows gathered into one
                            [K, 6] output: x, y, w, h, score (GatherND of the scores by the
                            selected indices), class (Cast)
    320n_nms_agnostic.onnx  class-agnostic NMS as many YOLO exports do it: corner boxes made
                            in the graph (centre -/+ half the size), each box's best class by
                            ReduceMax and ArgMax, then three outputs gathered by the selected
                            box index: boxes [K, 4], scores [K], classes [K] (int64)

and quantized:

    320n_weights_int8.onnx  weight-only int8 as exporters write it: every conv weight of 1024
                            values or more int8, symmetric, one float scale per output
                            channel, dequantized in the graph: by DequantizeLinear (axis 0),
                            or, every other conv, by the chain some exporters write instead
                            (Cast to float, Sub of a zero point, Mul by scales [M, 1, 1, 1])
    det_weights_int8.onnx   PP-OCRv4's detector the same way: its convs are followed by learnt
                            scalar affine maps (Mul, Add) before their activations
    320n_dynamic.onnx       ONNX Runtime's dynamic quantization (`quantize_dynamic`, int8
                            weights per tensor): each conv a DynamicQuantizeLinear of its
                            input, a ConvInteger, a Cast to float, a Mul by the two scales
                            and an Add of the bias
    320n_qdq.onnx           ONNX Runtime's static QDQ quantization (int8 weights per output
                            channel, uint8 activations), calibrated on four seeded images: for
                            tools/bench_cpu.sh only. ONNX Runtime runs it with int8 kernels,
                            whose requantization rounds otherwise than the float QDQ
                            arithmetic both runtimes' references share, so no test compares it

K, the number of kept boxes, depends on the image: Ingot plans it at its bound and returns the
rows the run filled. Writes OUT (default target/models); skipped when every output exists and is
newer than its source and this script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper


def with_nms(src: Path, out: Path, agnostic: bool) -> None:
    m = onnx.load(src)
    g = m.graph
    (head,) = [o.name for o in g.output]
    classes = g.output[0].type.tensor_type.shape.dim[1].dim_value - 4
    nodes: list[onnx.NodeProto] = []
    consts: list[onnx.TensorProto] = []
    count = iter(range(10_000))

    def const(value, dtype=np.int64) -> str:
        name = f"nms_c{next(count)}"
        consts.append(numpy_helper.from_array(np.array(value, dtype), name))
        return name

    def op(kind: str, inputs: list[str], outputs: int = 1, **attrs) -> str | list[str]:
        names = [f"nms_x{next(count)}" for _ in range(outputs)]
        nodes.append(helper.make_node(kind, inputs, names, **attrs))
        return names[0] if outputs == 1 else names

    def channels(start: int, end: int) -> str:
        return op("Slice", [head, const([start]), const([end]), const([1])])

    boxes = op("Transpose", [channels(0, 4)], perm=[0, 2, 1])  # [1, N, 4] centre format
    scores = channels(4, 4 + classes)  # [1, C, N]
    if agnostic:
        centre = op("Slice", [boxes, const([0]), const([2]), const([2])])
        half = op("Mul", [op("Slice", [boxes, const([2]), const([4]), const([2])]), const(0.5, np.float32)])
        corners = op("Concat", [op("Sub", [centre, half]), op("Add", [centre, half])], axis=2)
        best = op("ReduceMax", [scores], axes=[1], keepdims=1)  # [1, 1, N] (opset 17)
        label = op("ArgMax", [scores], axis=1, keepdims=0)  # [1, N]
        limits = [const([30]), const([0.45], np.float32), const([0.01], np.float32)]
        selected = op("NonMaxSuppression", [corners, best, *limits])
        index = op("Gather", [selected, const(2)], axis=1)  # [K]
        outputs = {
            "boxes": op("Gather", [op("Squeeze", [corners, const([0])]), index], axis=0),
            "scores": op("Gather", [op("Squeeze", [best, const([0, 1])]), index], axis=0),
            "classes": op("Gather", [op("Squeeze", [label, const([0])]), index], axis=0),
        }
        f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
        types = {"boxes": f32, "scores": f32, "classes": i64}
        shapes = {"boxes": ["K", 4], "scores": ["K"], "classes": ["K"]}
    else:
        limits = [const([20]), const([0.5], np.float32), const([0.01], np.float32)]
        selected = op("NonMaxSuppression", [boxes, scores, *limits], center_point_box=1)
        label = op("Cast", [op("Gather", [selected, const([1])], axis=1)], to=onnx.TensorProto.FLOAT)
        index = op("Gather", [selected, const(2)], axis=1)
        picked = op("Gather", [op("Squeeze", [boxes, const([0])]), index], axis=0)  # [K, 4]
        score = op("Unsqueeze", [op("GatherND", [scores, selected]), const([1])])  # [K, 1]
        outputs = {"detections": op("Concat", [picked, score, label], axis=1)}
        types = {"detections": onnx.TensorProto.FLOAT}
        shapes = {"detections": ["K", 6]}
    # The last node of each output writes it under its output name.
    for name, value in outputs.items():
        for n in nodes:
            n.output[:] = [name if o == value else o for o in n.output]
            n.input[:] = [name if i == value else i for i in n.input]
    g.node.extend(nodes)
    g.initializer.extend(consts)
    del g.output[:]
    g.output.extend(helper.make_tensor_value_info(n, types[n], shapes[n]) for n in outputs)
    onnx.checker.check_model(m)
    onnx.save(m, out)


def weights_int8(src: Path, out: Path) -> None:
    m = onnx.load(src)
    g = m.graph
    # Paddle's exports hold their weights in Constant nodes: make those initializers.
    for node in [n for n in g.node if n.op_type == "Constant"]:
        if [a.name for a in node.attribute] == ["value"]:
            t = onnx.TensorProto()
            t.CopyFrom(node.attribute[0].t)
            t.name = node.output[0]
            g.initializer.append(t)
            g.node.remove(node)
    # DequantizeLinear's axis needs opset 13. PP-OCR det is opset 12, whose ops (Conv, Clip,
    # Resize, BatchNormalization, ...) mean the same at 13.
    for opset in m.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, 13)
    inits = {t.name: t for t in g.initializer}
    nodes: list[onnx.NodeProto] = []
    convs = 0
    for node in g.node:
        w = inits.get(node.input[1]) if node.op_type == "Conv" else None
        if w is not None and int(np.prod(w.dims)) >= 1024:
            values = numpy_helper.to_array(w).astype(np.float32)
            rows = values.reshape(values.shape[0], -1)
            scale = (np.maximum(np.abs(rows).max(axis=1), 1e-12) / 127).astype(np.float32)
            q = np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8)
            name = w.name
            g.initializer.remove(w)
            g.initializer.append(numpy_helper.from_array(q.reshape(values.shape), f"{name}.q"))
            if convs % 2 == 0:
                g.initializer.append(numpy_helper.from_array(scale, f"{name}.scale"))
                g.initializer.append(numpy_helper.from_array(np.zeros_like(scale, np.int8), f"{name}.zero"))
                nodes.append(helper.make_node("DequantizeLinear", [f"{name}.q", f"{name}.scale", f"{name}.zero"], [name], axis=0))
            else:
                column = [values.shape[0]] + [1] * (values.ndim - 1)
                g.initializer.append(numpy_helper.from_array(scale.reshape(column), f"{name}.scale"))
                g.initializer.append(numpy_helper.from_array(np.zeros(column, np.float32), f"{name}.zero"))
                nodes.append(helper.make_node("Cast", [f"{name}.q"], [f"{name}.real"], to=onnx.TensorProto.FLOAT))
                nodes.append(helper.make_node("Sub", [f"{name}.real", f"{name}.zero"], [f"{name}.centred"]))
                nodes.append(helper.make_node("Mul", [f"{name}.centred", f"{name}.scale"], [name]))
            convs += 1
        nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)
    onnx.checker.check_model(m)
    onnx.save(m, out)


def dynamic(src: Path, out: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(src, out, weight_type=QuantType.QInt8)


def qdq(src: Path, out: Path) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Images(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(11)
            images = [rng.random((1, 3, 320, 320), dtype=np.float32) for _ in range(4)]
            self.images = iter({"images": x} for x in images)

        def get_next(self):
            return next(self.images, None)

    quantize_static(
        src,
        out,
        Images(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        weight_type=QuantType.QInt8,
        activation_type=QuantType.QUInt8,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("target/models"))
    args = ap.parse_args()
    yolo = args.models / "320n.onnx"
    det = args.models / "ch_PP-OCRv4_det_infer.onnx"
    makers = {
        "320n_nms.onnx": (yolo, lambda o: with_nms(yolo, o, agnostic=False)),
        "320n_nms_agnostic.onnx": (yolo, lambda o: with_nms(yolo, o, agnostic=True)),
        "320n_weights_int8.onnx": (yolo, lambda o: weights_int8(yolo, o)),
        "320n_dynamic.onnx": (yolo, lambda o: dynamic(yolo, o)),
        "320n_qdq.onnx": (yolo, lambda o: qdq(yolo, o)),
        "det_weights_int8.onnx": (det, lambda o: weights_int8(det, o)),
    }
    for name, (src, make) in makers.items():
        out = args.models / name
        newest_source = max(p.stat().st_mtime for p in [src, Path(__file__)])
        if out.exists() and out.stat().st_mtime > newest_source:
            continue
        part = out.with_suffix(".part.onnx")
        make(part)
        part.replace(out)
        print(f"make_detector_models: {out}")


if __name__ == "__main__":
    main()
