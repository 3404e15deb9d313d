"""The Python package on the PP-OCR direction classifier: compiled, planned and run on the CPU,
compared with ONNX Runtime, and every kind of mistake reported as an IngotError that says what
went wrong.

Models: $INGOT_MODELS, else target/models (made by tools/setup.sh). A missing model fails the
tests; nothing here skips.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import ingot

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("INGOT_MODELS", REPO / "target" / "models"))
CLS = MODELS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
SHAPE = (1, 3, 48, 192)
OUTPUT = "save_infer_model/scale_0.tmp_1"
# As tests/tests/ppocr.rs compares the PP-OCR models with ONNX Runtime.
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def model() -> Path:
    if not CLS.is_file():
        pytest.fail(f"{CLS} is missing: run bash tools/setup.sh (or set INGOT_MODELS)")
    return CLS


@pytest.fixture(scope="module")
def bundle(model: Path) -> bytes:
    return ingot.compile(model, input_shapes={"x": SHAPE})


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    # The classifier's inputs are normalised to [-1, 1].
    return np.random.default_rng(7).uniform(-1.0, 1.0, SHAPE).astype(np.float32)


@pytest.fixture(scope="module")
def reference(model: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (out,) = session.run([OUTPUT], {"x": x})
    return out


def test_the_installed_wheel_is_under_test() -> None:
    # Not python/ingot/ from the source tree, which has no extension module.
    assert ingot._native.__name__ == "ingot._native"
    assert re.fullmatch(r"\d+\.\d+\.\d+", ingot.__version__)


def test_compile_to_bytes_and_to_a_file_give_the_same_bundle(
    model: Path, bundle: bytes, tmp_path: Path
) -> None:
    assert isinstance(bundle, bytes) and bundle[:8] == b"INGOTBND"
    out = tmp_path / "cls.ingot"
    assert ingot.compile(str(model), input_shapes={"x": list(SHAPE)}, output=out) == out
    assert out.read_bytes() == bundle


def test_cpu_session_matches_onnxruntime(
    bundle: bytes, x: np.ndarray, reference: np.ndarray
) -> None:
    session = ingot.Session(bundle, devices="cpu")
    assert session.inputs == [ingot.TensorInfo("x", SHAPE, np.dtype(np.float32))]
    assert session.outputs == [ingot.TensorInfo(OUTPUT, (1, 2), np.dtype(np.float32))]
    outputs = session.run({"x": x})
    assert list(outputs) == [OUTPUT]
    got = outputs[OUTPUT]
    assert got.dtype == np.float32 and got.shape == (1, 2)
    np.testing.assert_allclose(got, reference, rtol=RTOL, atol=ATOL)
    # The arrays are the caller's: writable, not views of the session's memory.
    assert got.flags.writeable
    got[...] = 0
    np.testing.assert_allclose(session.run({"x": x})[OUTPUT], reference, rtol=RTOL, atol=ATOL)


def test_session_from_a_path_runs_the_same_bits(
    model: Path, bundle: bytes, x: np.ndarray, tmp_path: Path
) -> None:
    path = ingot.compile(model, input_shapes={"x": SHAPE}, output=tmp_path / "cls.ingot")
    from_path = ingot.Session(path, devices=["cpu"], threads=1)
    from_bytes = ingot.Session(bytearray(bundle), devices="cpu", threads=2, spin=False)
    assert (from_path.threads, from_bytes.threads) == (1, 2)
    assert (from_path.spin, from_bytes.spin) == (True, False)
    # The CPU backend's results depend on neither the thread count nor how idle threads wait.
    a, b = from_path.run({"x": x})[OUTPUT], from_bytes.run({"x": x})[OUTPUT]
    assert a.tobytes() == b.tobytes()
    # A non-contiguous array of the right shape is taken as its values.
    wide = np.zeros((1, 3, 48, 384), np.float32)
    wide[..., ::2] = x
    assert from_path.run({"x": wide[..., ::2]})[OUTPUT].tobytes() == a.tobytes()


def test_f16_weights_shrink_the_bundle_and_move_outputs_little(
    model: Path, bundle: bytes, x: np.ndarray
) -> None:
    half = ingot.compile(model, input_shapes={"x": SHAPE}, f16_weights=True)
    # cls's 509 KB of weights become 261 KB; the kernels that widen them are modules of their own.
    assert len(half) < 0.9 * len(bundle)
    want = ingot.Session(bundle, devices="cpu").run({"x": x})[OUTPUT]
    got = ingot.Session(half, devices="cpu").run({"x": x})[OUTPUT]
    assert got.tobytes() != want.tobytes()
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-2)


def test_placement_names_the_device_of_each_submodel(bundle: bytes) -> None:
    session = ingot.Session(bundle, devices="cpu")
    placement = session.placement
    assert len(placement) >= 1
    assert all(p.device == "cpu" and p.skipped == () for p in placement)
    assert placement[0].steps.start == 0
    assert str(placement).startswith("submodel 0 (steps 0..")
    assert session.device == "cpu"


def test_plan_text_and_json_agree(model: Path, bundle: bytes) -> None:
    plan = ingot.plan(model, input_shapes={"x": SHAPE})
    first = plan.text.splitlines()[0]
    header = re.fullmatch(r"variant main: (\d+) steps, \d+ tensors \(\d+ views\)", first)
    assert header, first
    steps = int(header.group(1))
    assert plan.json["variant"] == "main"
    assert plan.json["schema_version"] == 1
    assert len(plan.json["steps"]) == steps
    assert plan.json["steps"][0]["op"] == "Conv"
    j = plan.json
    assert 0 < j["lower_bound_bytes"] <= j["arena_bytes"] <= j["naive_bytes"]
    assert f"arena {plan.json['arena_bytes']} bytes" in plan.text
    assert x_tensor(plan.json)["shape"] == list(SHAPE)
    # The plan a bundle carries is the one planned from the model.
    assert ingot.plan(bundle) == plan
    assert str(plan) == plan.text


def x_tensor(plan_json: dict) -> dict:
    return next(t for t in plan_json["tensors"] if t["name"] == "x")


def test_variants_compile_into_one_bundle_and_plan_each(model: Path) -> None:
    half = (1, 3, 48, 96)
    variants = {"wide": (model, {"x": SHAPE}), "half": (model, {"x": half})}
    plans = ingot.plan(variants=variants)
    assert list(plans) == ["wide", "half"]
    assert plans["half"].json["variant"] == "half"
    assert x_tensor(plans["half"].json)["shape"] == list(half)
    assert plans["half"].json["arena_bytes"] < plans["wide"].json["arena_bytes"]
    bundle = ingot.compile(variants=variants)
    session = ingot.Session(bundle, devices="cpu", variant="half")
    assert session.inputs[0].shape == half
    assert session.run({"x": np.zeros(half, np.float32)})[OUTPUT].shape == (1, 2)
    # input_shapes apply to every variant, and one input given twice is refused.
    with raises(r"--input-shape gives 'x' twice"):
        ingot.plan(variants=variants, input_shapes={"x": SHAPE})


def raises(match: str):
    return pytest.raises(ingot.IngotError, match=match)


def test_a_missing_model_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing.onnx"
    with raises(r"cannot read ONNX model .*missing\.onnx: No such file"):
        ingot.compile(missing, input_shapes={"x": SHAPE})
    with raises(r"cannot open .*missing\.ingot"):
        ingot.Session(tmp_path / "missing.ingot")


def test_compile_errors_say_what_to_fix(model: Path) -> None:
    with raises(r"input 'x' has dynamic shape"):
        ingot.compile(model)
    with raises(r"'y' is not a graph input; the inputs are: x"):
        ingot.compile(model, input_shapes={"y": (1, 2)})


def test_garbage_is_not_a_bundle(bundle: bytes) -> None:
    with raises(r"not an Ingot bundle"):
        ingot.Session(b"not a bundle" * 100)
    with raises(r"bundle is truncated"):
        ingot.Session(bundle[: len(bundle) // 2])


def test_wrong_inputs_are_named(bundle: bytes, x: np.ndarray) -> None:
    session = ingot.Session(bundle, devices="cpu")
    with raises(r"the bundle has no input 'y'; its inputs: x"):
        session.run({"x": x, "y": x})
    with raises(r"missing input 'x'"):
        session.run({})
    with raises(re.escape("input 'x' should be f32 [1, 3, 48, 192], got f64 [1, 3, 48, 192]")):
        session.run({"x": x.astype(np.float64)})
    with raises(re.escape("input 'x' should be f32 [1, 3, 48, 192], got f32 [1, 3, 48, 96]")):
        session.run({"x": x[..., :96]})
    with raises(r"input 'x': unsupported element type <c8"):
        session.run({"x": x.astype(np.complex64)})
    # The session is still usable after refusing inputs.
    assert session.run({"x": x})[OUTPUT].shape == (1, 2)


def test_session_options_are_checked(bundle: bytes) -> None:
    with raises(r"unknown device 'tpu'"):
        ingot.Session(bundle, devices="tpu,cpu")
    with raises(r"bundle has no variant 'nope'; it has: main"):
        ingot.Session(bundle, devices="cpu", variant="nope")
    with raises(r"input_shapes apply to ONNX models"):
        ingot.plan(bundle, input_shapes={"x": SHAPE})
