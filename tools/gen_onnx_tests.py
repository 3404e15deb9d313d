"""Lays out ONNX's backend test suites under OUT/<suite>/<test>/ for the Rust `conformance` test.

Each test dir holds model.onnx and test_data_set_*/{input,output}_<i>.pb (TensorProto), the
layout of onnx/backend/test/data:

  node               generated from the case definitions the onnx wheel ships
                     (onnx.backend.test.case.node), written by the wheel's own
                     onnx.backend.test.cmd_tools.generate_data
  pytorch-converted, pytorch-operator, simple
                     copied from the wheel's data dirs
  light              the wheel ships light_<name>.onnx and light_<name>_output_0.pb only; the
                     input is built as onnx's own runner builds it
                     (onnx.backend.test.runner.Runner.generate_dummy_data with random=False:
                     arange(n) / n in float32, unknown dims as 1, for every graph input that
                     is not an initializer), and the tolerances come from the wheel's
                     data/real/test_<name>/data.json, copied beside the model.

Skips all work when OUT/stamp.txt names the same onnx version and script.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import types
import warnings
from pathlib import Path

import onnx
import onnx.backend.test.case.node as node_cases
from onnx import numpy_helper
from onnx.backend.test import cmd_tools
from onnx.backend.test.loader import DATA_DIR
from onnx.backend.test.runner import Runner

COPIED = ["pytorch-converted", "pytorch-operator", "simple"]


def generate_node(out: Path) -> None:
    # generate_data writes <output>/<case.kind>/<case.name> for the cases that
    # cmd_tools.model_test.collect_testcases() returns; hand it the node cases instead.
    cmd_tools.model_test = types.SimpleNamespace(collect_testcases=node_cases.collect_testcases)
    with warnings.catch_warnings():
        # numpy's overflow/divide warnings from cases that compute inf and nan on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        cmd_tools.generate_data(types.SimpleNamespace(output=str(out)))


def generate_light(data: Path, out: Path) -> None:
    for real in sorted((data / "real").iterdir()):
        # data.json: {"url": "onnx/backend/test/data/light/light_<name>.onnx", "rtol", "atol", ...}
        meta = real / "data.json"
        info = json.loads(meta.read_text())
        model_path = data / "light" / Path(info["url"]).name
        model = onnx.load(model_path)
        test_dir = out / real.name
        data_set = test_dir / "test_data_set_0"
        data_set.mkdir(parents=True)
        shutil.copy(model_path, test_dir / "model.onnx")
        shutil.copy(meta, test_dir / "data.json")
        inits = {i.name for i in model.graph.initializer}
        inputs = [x for x in model.graph.input if x.name not in inits]
        for i, x in enumerate(inputs):
            value = Runner.generate_dummy_data(x, seed=0, name=info["model_name"], random=False)
            tensor = numpy_helper.from_array(value, x.name)
            (data_set / f"input_{i}.pb").write_bytes(tensor.SerializeToString())
        for i in range(len(model.graph.output)):
            expected = model_path.with_name(f"{model_path.stem}_output_{i}.pb")
            shutil.copy(expected, data_set / f"output_{i}.pb")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("target/onnx-tests"))
    args = ap.parse_args()

    key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    stamp_text = f"onnx {onnx.__version__}, tools/gen_onnx_tests.py {key}\n"
    stamp = args.out / "stamp.txt"
    if stamp.exists() and stamp.read_text() == stamp_text:
        return

    data = Path(DATA_DIR)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # Built in a scratch dir beside OUT and moved into place whole.
    with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
        tmp = Path(tmp)
        generate_node(tmp)
        for suite in COPIED:
            shutil.copytree(data / suite, tmp / suite)
        generate_light(data, tmp / "light")
        (tmp / "stamp.txt").write_text(stamp_text)
        if args.out.exists():
            shutil.rmtree(args.out)
        tmp.rename(args.out)
        tmp.mkdir()  # so that TemporaryDirectory's cleanup finds what it made
    for suite in ["node", *COPIED, "light"]:
        n = sum(1 for d in (args.out / suite).iterdir() if (d / "model.onnx").exists())
        print(f"gen_onnx_tests: {suite}: {n} tests")


if __name__ == "__main__":
    main()
