"""Ingot from Python: compile ONNX models into memory-planned bundles, read their plans, run them.

    import numpy as np, ingot

    bundle = ingot.compile("cls.onnx", input_shapes={"x": (1, 3, 48, 192)})  # bytes
    print(ingot.plan("cls.onnx", input_shapes={"x": (1, 3, 48, 192)}).text)
    session = ingot.Session(bundle, devices="cpu")
    outputs = session.run({"x": np.zeros((1, 3, 48, 192), np.float32)})

The compiler and the runtime are the Rust crates the ``ingot`` CLI uses, in the extension module
``ingot._native``; this module only adapts arguments and results. Every failure the library
reports (a model that does not compile, a bundle that does not validate, inputs that do not
match) is an :class:`IngotError` whose message is the whole chain of causes, as the CLI prints it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import (
    Any,
    Dict,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
    overload,
)

import numpy as np

from . import _native

__all__ = [
    "IngotError",
    "Placement",
    "Plan",
    "Session",
    "Skip",
    "SubmodelPlacement",
    "TensorInfo",
    "compile",
    "plan",
]

__version__: str = _native.__version__

IngotError = _native.IngotError

PathLike = Union[str, "os.PathLike[str]"]
#: Input shapes by input name: ``{"x": (1, 3, 48, 192)}``.
Shapes = Mapping[str, Sequence[int]]
#: A variant's model, alone or with its own input shapes.
VariantModel = Union[PathLike, Tuple[PathLike, Shapes]]
#: A bundle: its bytes, or the path of a bundle file (mapped, not read).
BundleLike = Union[bytes, bytearray, memoryview, PathLike]


def _shapes(shapes: Optional[Shapes]) -> List[Tuple[str, List[int]]]:
    if shapes is None:
        return []
    if not isinstance(shapes, Mapping):
        kind = type(shapes).__name__
        raise TypeError(f"input shapes should be a dict of name -> dims, not {kind}")
    return [(str(name), [int(d) for d in dims]) for name, dims in shapes.items()]


def _variant_sources(
    model: Optional[PathLike], variants: Optional[Mapping[str, VariantModel]]
) -> List[Tuple[str, str, List[Tuple[str, List[int]]]]]:
    """(name, model path, own input shapes) per variant; a lone model is variant ``main``."""
    if (model is None) == (variants is None):
        raise TypeError("give either model or variants={name: model}, not both")
    if variants is None:
        return [("main", os.fspath(model), [])]  # type: ignore[arg-type]
    sources = []
    for name, source in variants.items():
        if isinstance(source, tuple):
            path, shapes = source
            sources.append((str(name), os.fspath(path), _shapes(shapes)))
        else:
            sources.append((str(name), os.fspath(source), []))
    return sources


def _bundle_arg(bundle: BundleLike) -> Union[bytes, str]:
    if isinstance(bundle, bytes):
        return bundle
    if isinstance(bundle, (bytearray, memoryview)):
        return bytes(bundle)
    return os.fspath(bundle)


def compile(
    model: Optional[PathLike] = None,
    input_shapes: Optional[Shapes] = None,
    variants: Optional[Mapping[str, VariantModel]] = None,
    output: Optional[PathLike] = None,
    verify: bool = False,
    max_loop_iterations: Optional[int] = None,
    f16_weights: bool = False,
) -> Union[bytes, Path]:
    """Compiles an ONNX model (or several, as variants of one bundle) into a bundle.

    Args:
        model: the ONNX file; the bundle has one variant, ``main``.
        input_shapes: static shapes for graph inputs, ``{"x": (1, 3, 48, 192)}``: required for
            symbolic dims, accepted for a static input when they agree. Applies to every variant.
        variants: instead of ``model``, ``{name: model}`` or ``{name: (model, input_shapes)}``:
            several graphs in one bundle, each weight stored once (the same file may appear
            under several names with different shapes).
        output: write the bundle to this file (streaming the weights) instead of returning it.
        verify: run the independent plan verifier.
        max_loop_iterations: the most iterations a ``Loop`` whose trip count is known only at
            run time may run where it has scan outputs: their storage is planned for that many
            rows, and a run that needs more raises ``IngotError``. Without it such a loop does
            not compile.
        f16_weights: store the float32 weights of convs, matrix products and embedding tables
            as float16, as ``ingot compile --f16-weights`` does: about half the weight bytes;
            arithmetic stays float32, and outputs move by the weights' rounding.

    Returns:
        The bundle's bytes, or ``Path(output)`` when ``output`` is given.

    Raises:
        IngotError: the model cannot be read, imported or compiled (the message says why).
    """
    sources = _variant_sources(model, variants)
    shared = _shapes(input_shapes)
    if output is None:
        return _native.compile(sources, shared, None, verify, max_loop_iterations, f16_weights)
    _native.compile(
        sources, shared, os.fspath(output), verify, max_loop_iterations, f16_weights
    )
    return Path(output)


class Plan(NamedTuple):
    """A variant's memory plan, as ``ingot plan`` prints it.

    ``text`` is deterministic (it changes only when the model or the planner does): keep it
    under review with a snapshot test. ``json`` is ``ingot plan --format json`` parsed: keys
    ``arena_bytes``, ``lower_bound_bytes``, ``naive_bytes``, ``weights_bytes``, ``submodels``,
    ``steps``, ``tensors``, ``schedule``, ``schema_version``...
    """

    text: str
    json: Dict[str, Any]

    def __str__(self) -> str:
        return self.text


def _plan(
    model: Union[bytes, str], shapes: List[Tuple[str, List[int]]], variant: Optional[str]
) -> Plan:
    text, json_text = _native.plan(model, shapes, variant)
    return Plan(text, json.loads(json_text))


@overload
def plan(
    model: BundleLike, input_shapes: Optional[Shapes] = None, *, variant: Optional[str] = None
) -> Plan: ...


@overload
def plan(
    model: None = None,
    input_shapes: Optional[Shapes] = None,
    *,
    variants: Mapping[str, VariantModel],
) -> Dict[str, Plan]: ...


def plan(
    model: Optional[BundleLike] = None,
    input_shapes: Optional[Shapes] = None,
    variants: Optional[Mapping[str, VariantModel]] = None,
    variant: Optional[str] = None,
) -> Union[Plan, Dict[str, Plan]]:
    """The memory plan of an ONNX model (compiled on the fly, no kernels built) or of a bundle.

    Args:
        model: an ONNX file, a bundle file, or a bundle's bytes.
        input_shapes: as for :func:`compile` (ONNX models only: a bundle's shapes are fixed).
        variants: instead of ``model``, ``{name: model}`` or ``{name: (model, input_shapes)}``
            as for :func:`compile`; returns ``{name: Plan}``.
        variant: which variant of a bundle (default: the first).

    Raises:
        IngotError: the model does not compile, the bundle does not open, no such variant.
    """
    shared = _shapes(input_shapes)
    if variants is not None:
        if model is not None:
            raise TypeError("give either model or variants={name: model}, not both")
        sources = _variant_sources(None, variants)
        return {name: _plan(path, shared + own, name) for name, path, own in sources}
    if model is None:
        raise TypeError("plan() needs a model (ONNX file, bundle file or bundle bytes) or variants")
    return _plan(_bundle_arg(model), shared, variant)


class TensorInfo(NamedTuple):
    """A graph input or output: its name, static shape and numpy element type."""

    name: str
    shape: Tuple[int, ...]
    dtype: np.dtype


class Skip(NamedTuple):
    """A device passed over for a submodel: the stage that failed and why."""

    device: str
    stage: str
    reason: str


class SubmodelPlacement(NamedTuple):
    """Where one submodel runs (``device``, e.g. ``cpu``) and the devices skipped before it."""

    index: int
    steps: range
    ops: str
    device: str
    skipped: Tuple[Skip, ...]


class Placement(Tuple[SubmodelPlacement, ...]):
    """One :class:`SubmodelPlacement` per submodel; ``str()`` is the runtime's report."""

    text: str

    def __new__(cls, submodels: Sequence[SubmodelPlacement], text: str) -> "Placement":
        obj = super().__new__(cls, submodels)
        obj.text = text
        return obj

    def __str__(self) -> str:
        return self.text


def _info(raw: Tuple[str, List[int], str]) -> TensorInfo:
    name, shape, descr = raw
    return TensorInfo(name, tuple(shape), np.dtype(descr))


class Session:
    """One variant of a bundle, prepared on devices and ready to run.

    Each submodel is prepared on the first device of ``devices`` that works (names: ``vulkan``,
    ``vulkan:N``, ``vulkan:cpu``, ``cpu``; default ``vulkan,cpu``); :attr:`placement` says where
    each runs and what was skipped why. ``vulkan`` is the best Vulkan GPU (discrete,
    integrated, then virtual), never a CPU-type device such as lavapipe, which runs only where
    named (``vulkan:cpu`` or ``vulkan:N``): where it is the only Vulkan device, the default
    list runs on the CPU. A submodel whose run fails moves to the next device unless
    ``failover=False``.

    Args:
        bundle: the bundle's bytes, or the path of a bundle file.
        devices: ``"vulkan,cpu"`` or ``["vulkan", "cpu"]``.
        threads: threads for the CPU backend (default: one per physical core).
        variant: the variant to run (default: the bundle's first).
        failover: move a submodel whose run fails to the next device and run it again.
        spin: the CPU backend's idle threads spin a while for work between steps before
            they park; ``False`` parks them at once (slower steps, cores left to others).

    Raises:
        IngotError: unknown device name, a bundle that does not open or validate, no such
            variant, no device that can run a submodel.
    """

    def __init__(
        self,
        bundle: BundleLike,
        devices: Union[str, Sequence[str], None] = None,
        threads: Optional[int] = None,
        variant: Optional[str] = None,
        failover: bool = True,
        spin: bool = True,
    ) -> None:
        if isinstance(devices, str):
            devices = devices.split(",")
        names = None if devices is None else list(devices)
        self._native = _native.Session(
            _bundle_arg(bundle), names, threads, variant, failover, spin
        )
        self._inputs = [_info(i) for i in self._native.inputs]
        self._outputs = [_info(o) for o in self._native.outputs]

    @property
    def inputs(self) -> List[TensorInfo]:
        """The graph inputs :meth:`run` takes, in the bundle's order."""
        return list(self._inputs)

    @property
    def outputs(self) -> List[TensorInfo]:
        """The graph outputs :meth:`run` returns, in the bundle's order."""
        return list(self._outputs)

    @property
    def placement(self) -> Placement:
        """Where each submodel runs now (a failover while running changes it)."""
        text, submodels = self._native.placement
        return Placement(
            [
                SubmodelPlacement(
                    index, range(start, end), ops, device, tuple(Skip(*s) for s in skipped)
                )
                for index, start, end, ops, device, skipped in submodels
            ],
            text,
        )

    @property
    def device(self) -> str:
        """The devices the submodels run on (``cpu``), joined with `` + `` when they differ."""
        return self._native.device

    @property
    def threads(self) -> int:
        """The CPU backend's thread count."""
        return self._native.threads

    @property
    def spin(self) -> bool:
        """Whether the CPU backend's idle threads spin a while for work during a run."""
        return self._native.spin

    def run(self, inputs: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        """Runs the variant on ``{input name: array}`` and returns ``{output name: array}``.

        Each array must have exactly the input's shape and dtype (see :attr:`inputs`); nothing
        is converted, so a float64 array for a float32 input is an error, as in the CLI. The
        GIL is released while the bundle runs.

        Raises:
            IngotError: an input missing or unknown, of the wrong shape or dtype; a run that
                failed on every device.
        """
        payload = []
        for name, value in inputs.items():
            # C order, as the runtime reads it; a 0-d input stays 0-d.
            array = np.asarray(value, order="C")
            if array.dtype.byteorder == ">":
                array = array.astype(array.dtype.newbyteorder("<"))
            payload.append((str(name), array.tobytes(), array.dtype.str, list(array.shape)))
        outputs = self._native.run(payload)
        # bytearrays: the arrays numpy builds over them are writable and own their memory.
        return {
            name: np.frombuffer(data, dtype=np.dtype(descr)).reshape(shape)
            for name, data, descr, shape in outputs
        }

    def __repr__(self) -> str:
        return repr(self._native)
