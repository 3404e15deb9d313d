"""Times the peers of `ingot bench` on one ONNX model, on a seeded random input.

    bench_peers.py MODEL.onnx --input-shape x=1x3x48x320 --peer ncnn-vulkan [--peer ort ...]
                   [--iterations 20] [--warmup 3] [--time-budget SEC] [--json]

Peers:
  ort          ONNX Runtime, CPU provider, graph optimisations on, intra_op_num_threads=1
               (--ort-threads 0 for all cores). Also the numeric reference for the others.
  ncnn-vulkan  ncnn (PyPI `ncnn`) on its Vulkan device, forced to fp32 (it defaults to fp16
               storage and arithmetic where the device has them). The model is converted
               once by the `pnnx` wheel's converter binary with the input shape fixed.
  iree-vulkan  IREE (`iree-base-compiler`, `iree-base-runtime`): the model with its input
               shape fixed and upgraded to opset 17 (torch-mlir has no lowering for
               BatchNormalization before opset 15), imported with iree-import-onnx and
               compiled with --iree-hal-target-device=vulkan --iree-vulkan-target=llvmpipe.

Per peer: load_ms (model to a ready session; the Vulkan instance and device are created
before it and reported as device_init_ms), first_run_ms (the first inference), then --warmup
untimed runs, then --iterations timed runs: median_ms, p90_ms. lavapipe JIT-compiles every
pipeline when it is created: ncnn creates most of its pipelines in load_model and some at
the first run, IREE all of them at the first run; Mesa's on-disk shader cache makes later
processes much cheaper. Every run goes from the host input array to the host output array
(upload and download included), as ORT's run() does. Several --peer values are timed
interleaved, one run of each in turn, so drift on a shared machine hits all of them alike;
with one peer, peak_rss_bytes is this process's high-water mark (Python and numpy included,
about baseline_rss_bytes) before ORT is loaded for the comparison.

Non-ORT outputs are compared with ORT's: max_abs_diff_vs_ort; beyond --tolerance the peer
is reported as disagreeing and the script exits 3. A peer that cannot run at all (missing
package, failed conversion, no Vulkan device, ran on the CPU instead) exits 2 with the reason.

Conversions and compiled modules are cached under target/bench/{ncnn,iree}/, keyed by the
model's sha256, the shapes and the tool versions.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PEERS = ("ort", "ncnn-vulkan", "iree-vulkan")
IREE_OPSET = 17


class PeerError(Exception):
    """The peer cannot run; the message says why."""


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        raise PeerError(f"Python package {dist!r} is not installed "
                        "(see tools/bench-requirements.txt)") from None


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def thread_cpu_s() -> float:
    """CPU time of the calling thread: a Vulkan peer's host thread mostly waits on a fence,
    so a large share means the work ran on the host instead of the device."""
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


def run_tool(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-25:])
        raise PeerError(f"{what} failed (exit {p.returncode}): {' '.join(cmd)}\n{tail}")


def cached_build(kind: str, model: Path, shapes: dict, key_parts: list[str], build,
                 tag: str = "") -> Path:
    """Runs build(tmp_dir) once per key into target/bench/KIND/<model>-<shape><tag>/, returns
    that directory; a changed key (model bytes, shapes, tool versions, flags) rebuilds."""
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    shape_tag = "_".join(f"{n}-{'x'.join(map(str, s))}" for n, s in shapes.items())
    key = "\n".join([digest, shape_tag, *key_parts]) + "\n"
    out = bench_dir() / kind / f"{model.stem}-{shape_tag}{tag}"
    if (out / "key.txt").is_file() and (out / "key.txt").read_text() == key:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        build(tmp)
        (tmp / "key.txt").write_text(key)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def bench_dir() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "bench"


def fixed_shape_model(model: Path, shapes: dict, opset: int | None, dest: Path) -> None:
    """Writes MODEL with its input dims fixed (PP-OCR's are symbolic), optionally converted to
    a newer opset, with shapes inferred through the graph."""
    import onnx
    from onnx import shape_inference, version_converter

    m = onnx.load(str(model))
    for inp in m.graph.input:
        if inp.name not in shapes:
            continue
        dims = inp.type.tensor_type.shape.dim
        if len(dims) != len(shapes[inp.name]):
            raise PeerError(f"input {inp.name} has rank {len(dims)}, got {shapes[inp.name]}")
        for d, v in zip(dims, shapes[inp.name]):
            d.ClearField("dim_param")
            d.dim_value = v
    if opset is not None:
        m = version_converter.convert_version(m, opset)
    m = shape_inference.infer_shapes(m, data_prop=True)
    onnx.save(m, str(dest))


# ---------------------------------------------------------------------------------------------
# Peers. Each has: name, device, notes, load() -> None, run(inputs) -> list[np.ndarray].


class Ort:
    name = "ort"

    def __init__(self, model: Path, threads: int):
        import onnxruntime as ort

        self.ort, self.model, self.threads = ort, model, threads
        self.device = "cpu"
        self.device_init_s = 0.0
        all_cores = threads == 0
        self.notes = [
            f"onnxruntime {ort.__version__}, CPUExecutionProvider, ORT_ENABLE_ALL, "
            f"intra_op_num_threads={'all (0)' if all_cores else threads}"
        ]
        self.extra = {"threads": "all" if all_cores else threads}

    def load(self) -> None:
        so = self.ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        self.sess = self.ort.InferenceSession(
            str(self.model), so, providers=["CPUExecutionProvider"]
        )

    def run(self, inputs: dict) -> list:
        return self.sess.run(None, inputs)


class NcnnVulkan:
    name = "ncnn-vulkan"

    def __init__(self, model: Path, shapes: dict, device_index: int):
        pnnx_version, ncnn_version = version("pnnx"), version("ncnn")
        spec = importlib.util.find_spec("pnnx")  # not imported: its package pulls in torch
        if spec is None or not spec.submodule_search_locations:
            raise PeerError("the pnnx package has no converter binary")
        pnnx_bin = Path(list(spec.submodule_search_locations)[0]) / "pnnx"
        if not os.access(pnnx_bin, os.X_OK):
            raise PeerError(f"pnnx converter binary not found at {pnnx_bin}")
        if len(shapes) != 1:
            raise PeerError("ncnn-vulkan: one model input supported (pnnx inputshape=)")
        (shape,) = shapes.values()
        if shape[0] != 1:
            raise PeerError("ncnn-vulkan: batch 1 only (ncnn Mats have no batch axis)")
        # fp16=0 keeps the weights fp32 in the .bin (pnnx's default writes fp16).
        args = [f"inputshape=[{','.join(map(str, shape))}]", "fp16=0"]

        def convert(d: Path) -> None:
            outs = {
                "pnnxparam": "m.pnnx.param", "pnnxbin": "m.pnnx.bin", "pnnxpy": "m_pnnx.py",
                "pnnxonnx": "m.pnnx.onnx", "ncnnparam": "m.ncnn.param",
                "ncnnbin": "m.ncnn.bin", "ncnnpy": "m_ncnn.py",
            }
            cmd = [str(pnnx_bin), str(model.resolve()), *args]
            cmd += [f"{k}={v}" for k, v in outs.items()]
            run_tool(cmd, "pnnx conversion", cwd=d)
            for f in ("m.pnnx.bin", "m.pnnx.onnx"):  # intermediates, ~model size each
                (d / f).unlink(missing_ok=True)

        t = time.perf_counter()
        self.dir = cached_build("ncnn", model, shapes, [f"pnnx {pnnx_version}", *args], convert)
        self.convert_s = time.perf_counter() - t
        self.input_names = list(shapes)

        import ncnn

        self.ncnn = ncnn
        t = time.perf_counter()
        ncnn.create_gpu_instance()
        count = ncnn.get_gpu_count()
        if count <= device_index:
            raise PeerError(f"ncnn sees {count} Vulkan device(s), wanted index {device_index}")
        self.device_index = device_index
        self.device_name = ncnn.get_gpu_info(device_index).device_name()
        self.device_init_s = time.perf_counter() - t
        self.device = "vulkan"
        self.notes = [
            f"ncnn {ncnn_version}, pnnx {pnnx_version} ({' '.join(args)}), fp32 "
            "(use_fp16_packed/storage/arithmetic and use_bf16_packed/storage off)"
        ]
        self.extra = {"device_name": self.device_name}

    def load(self) -> None:
        ncnn = self.ncnn
        net = ncnn.Net()
        o = net.opt
        o.use_vulkan_compute = True
        o.use_fp16_packed = o.use_fp16_storage = o.use_fp16_arithmetic = False
        o.use_bf16_packed = o.use_bf16_storage = False
        # num_threads stays ncnn's default (the core count) for its host-side work.
        self.notes.append(f"num_threads={o.num_threads}")
        net.set_vulkan_device(self.device_index)
        if net.load_param(str(self.dir / "m.ncnn.param")) != 0:
            raise PeerError(f"ncnn could not load {self.dir / 'm.ncnn.param'}")
        if net.load_model(str(self.dir / "m.ncnn.bin")) != 0:
            raise PeerError(f"ncnn could not load {self.dir / 'm.ncnn.bin'}")
        # ncnn silently falls back to the CPU when it has no Vulkan device: check it kept it.
        if not net.opt.use_vulkan_compute or net.vulkan_device() is None:
            raise PeerError("ncnn turned Vulkan compute off at load: it would run on the CPU")
        layers = net.layers()
        cpu = [f"{l.type}" for l in layers if not l.support_vulkan and l.type != "Input"]
        self.extra["vulkan_layers"] = f"{len(layers) - len(cpu)}/{len(layers)}"
        if cpu:
            self.notes.append(f"layers on the CPU: {', '.join(sorted(set(cpu)))} ({len(cpu)})")
        self.net = net
        self.in_names, self.out_names = list(net.input_names()), list(net.output_names())
        if len(self.in_names) != len(self.input_names):
            raise PeerError(f"ncnn model inputs {self.in_names}, ONNX inputs {self.input_names}")

    def run(self, inputs: dict) -> list:
        ex = self.net.create_extractor()
        for ncnn_name, onnx_name in zip(self.in_names, self.input_names):
            x = inputs[onnx_name]
            # ncnn Mats have no batch axis: feed the one batch item as C x H x W.
            ex.input(ncnn_name, self.ncnn.Mat(x[0]).clone())
        outs = []
        for name in self.out_names:
            ret, mat = ex.extract(name)
            if ret != 0:
                raise PeerError(f"ncnn extract {name} returned {ret}")
            outs.append(np.array(mat))
        return outs


class IreeVulkan:
    name = "iree-vulkan"

    def __init__(self, model: Path, shapes: dict, target: str):
        compiler_version = version("iree-base-compiler")
        runtime_version = version("iree-base-runtime")
        bindir = Path(sys.executable).parent
        import_bin, compile_bin = bindir / "iree-import-onnx", bindir / "iree-compile"
        for b in (import_bin, compile_bin):
            if not b.exists():
                raise PeerError(f"{b} not found: install iree-base-compiler in this venv")
        flags = ["--iree-hal-target-device=vulkan", f"--iree-vulkan-target={target}"]

        def build(d: Path) -> None:
            # In a child process: importing onnx here would inflate this one's peak RSS.
            fix = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                   "from pathlib import Path; import bench_peers as b; "
                   f"b.fixed_shape_model(Path({str(model)!r}), {shapes!r}, {IREE_OPSET}, "
                   f"Path({str(d / 'fixed.onnx')!r}))")
            run_tool([sys.executable, "-B", "-c", fix], "fixing the input shape with onnx")
            run_tool([str(import_bin), str(d / "fixed.onnx"), "-o", str(d / "m.mlir")],
                     "iree-import-onnx")
            run_tool([str(compile_bin), str(d / "m.mlir"), *flags, "-o", str(d / "m.vmfb")],
                     "iree-compile")
            (d / "fixed.onnx").unlink()
            (d / "m.mlir").unlink()

        t = time.perf_counter()
        key = [f"iree-base-compiler {compiler_version}", f"opset {IREE_OPSET}", *flags]
        self.vmfb = cached_build("iree", model, shapes, key, build, f"-{target}") / "m.vmfb"
        self.convert_s = time.perf_counter() - t
        self.input_names = list(shapes)

        import iree.runtime as rt

        self.rt = rt
        devices = rt.get_driver("vulkan").query_available_devices()
        if not devices:
            raise PeerError("IREE's vulkan driver finds no device")
        t = time.perf_counter()
        self.config = rt.Config("vulkan")
        self.device_init_s = time.perf_counter() - t
        self.device = "vulkan"
        self.device_name = devices[0]["name"]
        self.notes = [
            f"iree-base-compiler {compiler_version} / runtime {runtime_version}, "
            f"opset upgraded to {IREE_OPSET}, {' '.join(flags)}"
        ]
        self.extra = {"device_name": self.device_name}

    def load(self) -> None:
        rt = self.rt
        self.ctx = rt.SystemContext(config=self.config)
        vm = rt.VmModule.mmap(self.config.vm_instance, str(self.vmfb))
        self.ctx.add_vm_module(vm)
        funcs = [f for f in vm.function_names
                 if not f.startswith("__") and not f.endswith("$async")]
        if len(funcs) != 1:
            raise PeerError(f"IREE module has functions {vm.function_names}, expected one entry")
        self.func = self.ctx.modules[vm.name][funcs[0]]

    def to_host(self, arr) -> np.ndarray:
        # DeviceArray.to_host() fails on lavapipe: it imports a numpy allocation as a Vulkan
        # host pointer, which must be 4096-aligned. Copy through a mappable staging buffer.
        rt, dev = self.rt, self.config.device
        bv = arr._buffer_view
        src = bv.get_buffer()
        staging = dev.allocator.allocate_buffer(
            memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
            allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
            allocation_size=src.byte_length(),
        )
        sem = dev.create_semaphore(0)
        dev.queue_copy(src, staging, wait_semaphores=rt.HalFence.create_at(sem, 0),
                       signal_semaphores=rt.HalFence.create_at(sem, 1))
        rt.HalFence.create_at(sem, 1).wait()
        dtype = rt.HalElementType.map_to_dtype(bv.element_type)
        return np.array(staging.map().asarray(bv.shape, dtype))

    def run(self, inputs: dict) -> list:
        out = self.func(*(inputs[n] for n in self.input_names))
        return [self.to_host(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


# ---------------------------------------------------------------------------------------------


def parse_shape(text: str) -> tuple[str, list[int]]:
    name, sep, dims = text.partition("=")
    try:
        shape = [int(d) for d in dims.split("x")]
    except ValueError:
        shape = []
    if not sep or not name or not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=1x3x48x320, got {text!r}")
    return name, shape


def make_peer(name: str, args, shapes: dict):
    if name == "ort":
        return Ort(args.model, args.ort_threads)
    if name == "ncnn-vulkan":
        return NcnnVulkan(args.model, shapes, args.vulkan_device)
    return IreeVulkan(args.model, shapes, args.iree_target)


def measure(peers: list, inputs: dict, args) -> dict:
    """Loads each peer, runs it once (first run), warms it up, then times them interleaved."""
    res = {}
    for p in peers:
        r = res[p.name] = {"baseline_rss_bytes": rss_bytes()}
        t = time.perf_counter()
        p.load()
        r["load_s"] = time.perf_counter() - t
        t = time.perf_counter()
        r["outputs"] = p.run(inputs)
        r["first_run_s"] = time.perf_counter() - t
    for _ in range(args.warmup):
        for p in peers:
            p.run(inputs)
    times = {p.name: [] for p in peers}
    host_cpu = {p.name: 0.0 for p in peers}
    start = time.perf_counter()
    for i in range(args.iterations):
        for p in peers:
            c, t = thread_cpu_s(), time.perf_counter()
            p.run(inputs)
            times[p.name].append(time.perf_counter() - t)
            host_cpu[p.name] += thread_cpu_s() - c
        if args.time_budget and i >= 2 and time.perf_counter() - start > args.time_budget:
            break
    for p in peers:
        r = res[p.name]
        r["times"] = times[p.name]
        r["host_thread_cpu_share"] = host_cpu[p.name] / sum(times[p.name])
        r["peak_rss_bytes"] = rss_bytes()
    return res


def input_types(model: Path) -> dict:
    """The numpy type of each input the model declares."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(model), load_external_data=False).graph
    return {
        i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in graph.input
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--input-shape", type=parse_shape, action="append", required=True,
                    help="NAME=1x3x48x320, once per model input")
    ap.add_argument("--peer", choices=PEERS, action="append", required=True,
                    help="repeat to time several peers interleaved")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs after the first run")
    ap.add_argument("--time-budget", type=float, default=0.0,
                    help="stop timing after this many seconds (at least 3 iterations)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--int-range", type=lambda v: tuple(int(x) for x in v.split(",")),
                    default=(0, 1), help="LO,HI of integer inputs, both included")
    ap.add_argument("--ort-threads", type=int, default=1, help="0 = all cores")
    ap.add_argument("--iree-target", default="llvmpipe",
                    help="--iree-vulkan-target (llvmpipe is IREE's description of lavapipe)")
    ap.add_argument("--vulkan-device", type=int, default=0, help="ncnn's Vulkan device index")
    ap.add_argument("--tolerance", type=float, default=1e-3,
                    help="max |peer - ORT| accepted for the non-ORT peers")
    ap.add_argument("--json", action="store_true", help="one JSON object per peer per line")
    args = ap.parse_args()
    if args.iterations < 1:
        ap.error("--iterations must be at least 1")
    if not args.model.is_file():
        ap.error(f"{args.model} not found")
    peers_wanted = list(dict.fromkeys(args.peer))
    shapes = dict(args.input_shape)

    # Same seeded input for every peer: floats in PP-OCR's normalised range, integers (token
    # ids) uniform in --int-range, each of the type the model declares.
    rng = np.random.default_rng(args.seed)
    types = input_types(args.model)
    lo, hi = args.int_range

    def draw(name: str, shape: list) -> np.ndarray:
        dtype = types.get(name, np.float32)
        if np.issubdtype(dtype, np.integer):
            return rng.integers(lo, hi + 1, shape).astype(dtype)
        return rng.uniform(-1, 1, shape).astype(dtype)

    inputs = {n: draw(n, s) for n, s in shapes.items()}

    current = None
    try:
        peers = []
        for name in peers_wanted:
            current = name
            peers.append(make_peer(name, args, shapes))
        current = None
        res = measure(peers, inputs, args)
        current = "ort (reference)"
        ref = res["ort"]["outputs"] if "ort" in res else None
        if ref is None and len(peers) > (1 if "ort" in peers_wanted else 0):
            ref = Ort(args.model, 1)
            ref.load()
            ref = ref.run(inputs)
    except Exception as e:  # noqa: BLE001 - any failure of a peer is reported the same way
        why = str(e) if isinstance(e, PeerError) else f"{type(e).__name__}: {e}"
        who = current or "/".join(peers_wanted)
        print(f"bench_peers: {who} cannot run on {args.model.name}: {why}", file=sys.stderr)
        return 2

    status = 0
    for p in peers:
        r = res[p.name]
        times = np.array(r["times"])
        diff = None
        if p.name != "ort":
            if len(r["outputs"]) != len(ref):
                print(f"bench_peers: {p.name} gave {len(r['outputs'])} outputs, ORT {len(ref)}",
                      file=sys.stderr)
                return 2
            diff = 0.0
            for o, want in zip(r["outputs"], ref):
                if o.size != want.size:
                    print(f"bench_peers: {p.name} output has {o.shape}, ORT {want.shape}",
                          file=sys.stderr)
                    return 2
                d = float(np.abs(o.reshape(want.shape) - want).max())
                diff = None if diff is None or not np.isfinite(d) else max(diff, d)
        notes = list(p.notes)
        if p.name != "ort" and diff is None:
            notes.append("NaN/Inf in the output")
        if p.device == "vulkan":
            share = r["host_thread_cpu_share"]
            notes.append(f"host thread CPU {share:.0%} of run time")
            if share > 0.5:
                notes.append("the host thread did most of the work: not a device run")
                print(f"bench_peers: {p.name} kept its host thread busy {share:.0%} of the "
                      "time: it did not run on the Vulkan device", file=sys.stderr)
                status = 2
        if getattr(p, "convert_s", None) is not None:
            notes.append(f"conversion/compile {p.convert_s:.1f} s (0 when cached)")
        agrees = p.name == "ort" or (diff is not None and diff <= args.tolerance)
        if not agrees:
            why = "NaN/Inf in its output" if diff is None else f"max |diff| {diff:.3g}"
            print(f"bench_peers: {p.name} disagrees with ORT on {args.model.name}: {why} "
                  f"(tolerance {args.tolerance:g})", file=sys.stderr)
            status = status or 3
        out = {
            "peer": p.name,
            "device": p.device,
            "load_ms": ms(r["load_s"]),
            "first_run_ms": ms(r["first_run_s"]),
            "median_ms": ms(float(np.median(times))),
            "p90_ms": ms(float(np.percentile(times, 90))),
            "max_abs_diff_vs_ort": diff,
            "agrees_with_ort": agrees,
            "notes": "; ".join(notes),
            "model": args.model.name,
            "input_shapes": {n: "x".join(map(str, s)) for n, s in shapes.items()},
            "iterations": len(times),
            "warmup": args.warmup,
            "device_init_ms": ms(p.device_init_s),
            **p.extra,
        }
        if len(peers) == 1:
            out["peak_rss_bytes"] = r["peak_rss_bytes"]
            out["baseline_rss_bytes"] = r["baseline_rss_bytes"]
        if args.json:
            print(json.dumps(out), flush=True)
        else:
            print(f"{args.model.name:40} {p.name:12} load {out['load_ms']:9.1f} ms  first "
                  f"{out['first_run_ms']:9.1f} ms  median {out['median_ms']:9.2f} ms  p90 "
                  f"{out['p90_ms']:9.2f} ms  diff {diff if diff is not None else '-'}  "
                  f"({out['notes']})")
    return status


if __name__ == "__main__":
    sys.exit(main())
