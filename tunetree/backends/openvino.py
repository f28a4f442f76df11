"""OpenVINO: converts the module and runs it with the OpenVINO runtime.

Conversion goes through ``torch.export`` (tracing as a fallback); the runtime runs on the
CPU or an Intel GPU.

The default precision is f32: on CPUs with bf16 units OpenVINO would otherwise compute in
bf16 and change results by about 1e-2. :class:`OpenVINOBf16` is the opt-in reduced-precision
candidate.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import BackendError, InvalidInputError
from ..signature.graph import Graph, GraphKey
from .base import Backend, ChangesResults, Runner
from .dtypes import as_numpy, as_torch, carries, check_numpy_dtypes
from .export_context import (
    attention_as_eager,
    describe_error,
    empty_operands_dropped,
    exporting,
    parameters_on_cpu,
    quiet,
)
from .files import artifact_file
from .flat import FlatGraph, FlatInputs, FlatOutputs, check_saved_io, saved_outputs, used_inputs
from .packages import not_installed_reason
from .ranged_export import export_ranged
from .ranges import AxisBounds, AxisDims, axis_dims, narrowed_to_artifact
from .safe_config import check_choice, check_count, check_fields, check_pattern, check_scalar
from .value_dependence import ValueDependentError, data_dependent_reason, traced_values_checked

log = logging.getLogger(__name__)

_MODEL_FILE = "model.xml"
_MULTI_DEVICES = ("AUTO", "MULTI", "HETERO", "BATCH")
_ONE_DEVICE = r"(?:CPU|GPU|NPU)(?:\.[0-9]{1,2})?"
DEVICE = re.compile(
    rf"{_ONE_DEVICE}|(?:AUTO|MULTI|HETERO|BATCH)(?::{_ONE_DEVICE}(?:,{_ONE_DEVICE}){{0,7}})?"
)
"""OpenVINO device strings a saved config may name: CPU, GPU.1, NPU, AUTO:GPU,CPU ..."""
_PRECISIONS = ("f32", "bf16", "f16")
_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")


TELEMETRY_CONSENT = ("intel", "openvino_telemetry")
"""Where OpenVINO's telemetry reads its consent, under the home directory ("0": opted out)."""


@functools.lru_cache(maxsize=1)
def _private_dir() -> str:
    """A directory of this process for files OpenVINO writes into the home directory.

    Those are telemetry files under ``~/intel``; the directory is removed at exit. It holds
    OpenVINO's own telemetry opt-out (the consent file its ``opt_in_out --opt_out`` writes):
    with no consent file OpenVINO counts as consent, and its converter then sends events from
    a thread pool that starts a process per event by ``fork``, beside the calling threads
    (a tuning process with file locks and logging held hung there: a fork from a thread is
    not safe), and tries the network from machines that may have none.
    """
    path = tempfile.mkdtemp(prefix="tunetree-openvino-home-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    consent = os.path.join(path, *TELEMETRY_CONSENT)
    os.makedirs(os.path.dirname(consent), exist_ok=True)
    with open(consent, "w") as file:
        file.write("0")
    return path


@contextlib.contextmanager
def private_home() -> Iterator[None]:
    """Run OpenVINO calls with the home and XDG directories pointed at :func:`_private_dir`.

    So importing or calling OpenVINO writes nothing under the user's home directory.
    """
    names = ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME")
    saved = {name: os.environ.get(name) for name in names}
    home = _private_dir()
    os.environ.update(dict.fromkeys(names, home))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load_openvino() -> Any:
    """The ``openvino`` module, imported with the home directory private.

    Importing OpenVINO starts its telemetry, which reads its consent from the home directory
    then (see :func:`_private_dir`); a later conversion starts it again, inside
    :func:`private_home` too.
    """
    if "openvino" in sys.modules:  # imported already: its telemetry has read its consent
        return sys.modules["openvino"]
    with private_home():
        import openvino
    return openvino


@functools.lru_cache(maxsize=1)
def _core() -> Any:
    """One OpenVINO Core per process (it loads the device plugins)."""
    with private_home():
        import openvino

        core = openvino.Core()
        # No native log lines on the terminal: what fails comes back in the exception, which
        # the candidate's row keeps. A device that has no log level keeps its default.
        for device in core.available_devices:
            with contextlib.suppress(Exception):
                core.set_property(device, {"LOG_LEVEL": "LOG_NONE"})
        return core


class OpenVINORunner(Runner):
    """A compiled OpenVINO model with one infer request.

    Its inputs' and outputs' dtypes must cross numpy (checked by ``build`` and ``load``
    before a model is made or read). Inputs are shared with OpenVINO (no copy on the CPU);
    every call returns freshly allocated outputs, so a later call never overwrites what an
    earlier one returned. Calls are serialised by a lock (one request).
    """

    def __init__(
        self,
        backend: OpenVINO,
        model: Any,
        inputs: FlatInputs,
        outputs: FlatOutputs,
        device: torch.device,
        keepalive: Any = None,
    ) -> None:
        super().__init__(backend)
        if len(model.inputs) != len(inputs.paths):
            raise BackendError(
                f"OpenVINO model has {len(model.inputs)} inputs, the graph {len(inputs.paths)}"
            )
        if len(model.outputs) != len(outputs.positions):
            raise BackendError(
                f"OpenVINO model has {len(model.outputs)} outputs, eager {len(outputs.positions)}"
            )
        self.model = model
        self.inputs = inputs
        self.outputs = outputs
        self.device = device
        self.keepalive = keepalive  # tensors whose memory the converted model may share
        with private_home():
            self.compiled = _core().compile_model(
                model, backend.openvino_device(device), backend.compile_config()
            )
        self.request = self.compiled.create_infer_request()
        self.lock = threading.Lock()
        import openvino

        self.tensor = openvino.Tensor

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the infer request on the picked inputs and rebuild eager's output structure.

        Inputs are bound to the request's ports as tensors sharing their memory (no copy, and
        none of the conversions OpenVINO's Python dispatcher tries per input: the dtypes were
        checked when the model was built); 0-d inputs take the dispatcher, which reshapes them.
        """
        arrays = [as_numpy(t) for t in self.inputs.pick(args, kwargs)]
        with self.lock:
            try:
                if all(a.ndim for a in arrays):
                    for port, array in enumerate(arrays):
                        self.request.set_input_tensor(port, self.tensor(array, shared_memory=True))
                    inputs: Any = None
                else:  # by port index: a list costs the dispatcher a scan (about 15 us)
                    inputs = dict(enumerate(arrays))
                # share_outputs=False: OpenVINO copies results into new arrays that we own.
                results = self.request.infer(inputs, share_inputs=True, share_outputs=False)
            except RuntimeError as exc:
                raise BackendError(
                    f"OpenVINO refused this call ({str(exc).strip()[:300]}); the runner "
                    "serves only calls inside its graph"
                ) from exc
            values = results.to_tuple()
        tensors = [
            as_torch(value, dtype, self.device)
            for value, dtype in zip(values, self.outputs.dtypes, strict=True)
        ]
        return self.outputs.rebuild(tensors, (args, kwargs))

    def save(self, directory: Path) -> dict[str, Any]:
        """Write the model (weights as they are, not compressed) and record the I/O records."""
        import openvino

        # compress_to_fp16 would round the weights: keep them as they are.
        openvino.save_model(self.model, str(directory / _MODEL_FILE), compress_to_fp16=False)
        return {
            "model": _MODEL_FILE,
            "inputs": self.inputs.to_json(),
            "outputs": self.outputs.to_json(),
        }


@dataclasses.dataclass(frozen=True)
class OpenVINO(Backend):
    """OpenVINO runtime, f32 so results are kept.

    Args:
        device: An OpenVINO device name (``"CPU"``, ``"GPU.1"``, ``"AUTO"``); None maps the
            torch device (cpu -> CPU, xpu:N -> GPU.N).
        precision: OpenVINO's ``INFERENCE_PRECISION_HINT``: f32 only here (see
            :class:`OpenVINOBf16`).
        performance_hint: ``"LATENCY"``, ``"THROUGHPUT"`` or ``"CUMULATIVE_THROUGHPUT"``.
        num_streams: Overrides OpenVINO's choice of streams.
        num_threads: Overrides OpenVINO's choice of threads.

    Raises:
        InvalidInputError: A precision other than f32, or an unknown hint.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.OpenVINO(performance_hint="THROUGHPUT").kind
        'openvino'
    """

    kind: ClassVar[str] = "openvino"
    typical_build_s: ClassVar[float | None] = 2.0  # docs/measurements.md
    extra: ClassVar[str | None] = "openvino"
    libraries: ClassVar[tuple[str, ...]] = ("openvino",)
    device: str | None = None
    precision: str = "f32"
    performance_hint: str = "LATENCY"
    num_streams: int | None = None
    num_threads: int | None = None

    def __post_init__(self) -> None:
        if type(self) is OpenVINO and self.precision != "f32":
            raise InvalidInputError(
                f"OpenVINO(precision={self.precision!r}) would change results; use "
                f"OpenVINOBf16(precision={self.precision!r}) for a reduced-precision candidate"
            )
        if self.performance_hint not in _HINTS:
            raise InvalidInputError(
                f"performance_hint must be one of {', '.join(_HINTS)}, "
                f"not {self.performance_hint!r}"
            )

    @classmethod
    def check_saved_config(cls, config: Any) -> None:
        """Admit known fields with checked values, and any other field holding a plain scalar.

        Checked values: a device of :data:`DEVICE`'s form, known precision and hint, stream and
        thread counts in 0..1024.
        """
        check_fields(cls.kind, cls, config)
        check_pattern(cls.kind, "device", config.get("device"), DEVICE)
        check_choice(cls.kind, "precision", config.get("precision", "f32"), _PRECISIONS)
        check_choice(
            cls.kind, "performance_hint", config.get("performance_hint", "LATENCY"), _HINTS
        )
        check_count(cls.kind, "num_streams", config.get("num_streams"))
        check_count(cls.kind, "num_threads", config.get("num_threads"))
        for field, value in config.items():
            check_scalar(cls.kind, field, value)

    def openvino_device(self, device: torch.device) -> str:
        """The OpenVINO device that runs graphs whose tensors live on ``device``."""
        if self.device is not None:
            return self.device
        if device.type == "cpu":
            return "CPU"
        if device.type == "xpu":
            return "GPU" if device.index is None else f"GPU.{device.index}"
        raise BackendError(f"OpenVINO has no device for torch {device.type!r}")

    def compile_config(self) -> dict[str, Any]:
        """The properties passed to ``Core.compile_model``."""
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": self.precision,
            "PERFORMANCE_HINT": self.performance_hint,
        }
        if self.num_streams is not None:
            config["NUM_STREAMS"] = str(self.num_streams)
        if self.num_threads is not None:
            config["INFERENCE_NUM_THREADS"] = self.num_threads
        return config

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why OpenVINO cannot run on ``device``: package missing, or device not available."""
        missing = not_installed_reason(self, "openvino")
        if missing is not None:
            return missing
        if self.device is None and device.type not in ("cpu", "xpu"):
            return (
                f"OpenVINO runs on CPUs and Intel GPUs, not on {device.type!r}; set "
                "device='CPU' to run there with copies to and from the host"
            )
        target = self.openvino_device(device)
        base = target.split(".")[0].split(":")[0]
        available = list(_core().available_devices)
        if base not in _MULTI_DEVICES and not any(d.split(".")[0] == base for d in available):
            return f"OpenVINO device {target!r} is not available here (found: {available})"
        return None

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        """Convert the flat graph to an OpenVINO model with the graph's input shapes."""
        flat = FlatGraph.of(module, graph)
        flat.check_numpy_dtypes()
        model, exported = _convert(flat, module)
        kept = list(range(len(flat.inputs.paths)))
        if exported is not None and len(model.inputs) < len(kept):
            kept = used_inputs(exported)  # OpenVINO dropped the inputs the graph never reads
        inputs = flat.inputs.subset(kept)
        dims = axis_dims(flat.key)
        _set_input_shapes(model, inputs, [dims[i] for i in kept])
        # The converted model may share weight memory with the exported program's tensors.
        return OpenVINORunner(self, model, inputs, flat.outputs, device, keepalive=exported)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        """Read and check the saved model (:func:`_read_saved`), then rebuild the runner."""
        model, inputs, served = _read_saved(directory, saved, key, self.preserves_results)
        outputs = FlatOutputs.from_json(saved.get("outputs"), module, key, device)
        runner = OpenVINORunner(self, model, inputs, outputs, device)
        if served is not key:
            log.warning(
                "the saved OpenVINO model serves %s only, not all of %s (the file's ranges "
                "were wider than its model): calls outside run the original forward",
                served,
                key,
            )
            runner.served = served
        return runner

    def check_saved_artifacts(
        self, key: GraphKey, directory: Path, saved: dict[str, Any]
    ) -> GraphKey | None:
        """The part of ``key`` the saved model serves: :func:`_read_saved`, as ``load`` runs it."""
        return _read_saved(directory, saved, key, self.preserves_results)[2]

    def check_saved_runner(self, key: GraphKey, saved: Any, max_elements: int) -> None:
        """The model's file name and the I/O records against ``key`` (:func:`.check_saved_io`)."""
        name = saved.get("model") if isinstance(saved, dict) else None
        if not isinstance(name, str) or not name.endswith(".xml") or Path(name).name != name:
            raise BackendError(f"refusing artifact name {str(name)[:80]!r}: not a plain file name")
        check_saved_io(key, saved, max_elements)


def _read_saved(
    directory: Path, saved: dict[str, Any], key: GraphKey, keeps_results: bool = False
) -> tuple[Any, FlatInputs, GraphKey]:
    """The saved model, its input record and the part of ``key`` it serves, without the module.

    The model file's name is checked (:func:`.artifact_file`), the input record against
    ``key``, the model is read with OpenVINO's own reader and checked against the records
    (:func:`_served_by`). Both ``load`` and ``tunetree info`` (through
    :meth:`OpenVINO.check_saved_artifacts`) run this. BackendError on a mismatch.
    """
    model_file = artifact_file(directory, saved.get("model"), ".xml")
    artifact_file(directory, model_file.with_suffix(".bin").name)
    inputs = FlatInputs.from_json(saved.get("inputs"))
    inputs.check_against(key)
    output_dtypes = saved_outputs(saved.get("outputs"))[3]
    check_numpy_dtypes((*inputs.dtypes, *output_dtypes))
    with private_home():
        model = _core().read_model(str(model_file))
    if keeps_results:
        found = reduced_precision(model)
        if found is not None:
            raise BackendError(
                f"the saved OpenVINO model {found}, so it changes results, but its record "
                "says it is a results-keeping openvino runner: the kind comes from the "
                "content, not the record (refused)"
            )
    return model, inputs, _served_by(model, inputs, output_dtypes, key)


_REDUCED_TYPES = frozenset({"f16", "bf16", "f8e4m3", "f8e5m2", "f8e8m0", "f4e2m1", "nf4"})
"""OpenVINO element types narrower than a float32 model computes in (``Type.get_type_name``)."""
_INTEGER_WEIGHTS = frozenset({"i8", "u8", "i4", "u4", "u2", "u1"})
"""Integer constants that, converted to a float, are compressed weights."""


def reduced_precision(model: Any) -> str | None:
    """What in an OpenVINO model computes below its ports' precision, or None.

    A ``FakeQuantize``/``FakeConvert`` node, a constant of a reduced float type the model's
    inputs and outputs do not carry, or an integer constant converted to a float (weight
    compression, as NNCF writes it).
    """
    carried = {p.get_element_type().get_type_name() for p in [*model.inputs, *model.outputs]}
    for op in model.get_ops():
        kind = op.get_type_name()
        if kind in ("FakeQuantize", "FakeConvert"):
            return f"holds quantization nodes ({kind})"
        if kind == "Constant":
            element = op.get_output_element_type(0).get_type_name()
            if element in _REDUCED_TYPES and element not in carried:
                return f"holds {element} constants ({op.get_friendly_name()[:60]!r})"
        if kind == "Convert" and _decompresses_weights(op):
            element = op.get_input_element_type(0).get_type_name()
            return f"holds {element} weights converted to float"
    return None


_SCALING = frozenset({"Subtract", "Multiply", "Reshape", "Transpose", "Convert"})
_WEIGHT_USERS = frozenset({"MatMul", "Convolution", "GroupConvolution", "Gather"})


def _decompresses_weights(convert: Any) -> bool:
    """Whether ``convert`` turns an integer constant into float weights of a product.

    The pattern weight compression writes: ``Constant(u8) -> Convert -> Subtract ->
    Multiply -> MatMul``. An integer mask converted to a float and used elsewhere is not.
    """
    source = convert.input_value(0).get_node()
    element = convert.get_input_element_type(0).get_type_name()
    if source.get_type_name() != "Constant" or element not in _INTEGER_WEIGHTS:
        return False
    if not convert.get_output_element_type(0).is_real():
        return False
    frontier, seen = [convert], 0
    while frontier and seen < 16:
        node = frontier.pop()
        seen += 1
        for target in node.output(0).get_target_inputs():
            user = target.get_node()
            kind = user.get_type_name()
            if kind in _WEIGHT_USERS:
                return True
            if kind in _SCALING:
                frontier.append(user)
    return False


def _served_by(
    model: Any, inputs: FlatInputs, output_dtypes: tuple[torch.dtype, ...], key: GraphKey
) -> GraphKey:
    """The part of ``key`` a saved OpenVINO model serves, checked against what it declares.

    Its inputs and outputs must be as many as the records say, of their element types; its
    inputs' partial shapes narrow ``key``'s ranges (:func:`.narrowed_to_artifact`), so a call
    the model would refuse takes the original forward. BackendError on a mismatch.
    """
    if len(model.inputs) != len(inputs.paths) or len(model.outputs) != len(output_dtypes):
        raise BackendError(
            f"OpenVINO model has {len(model.inputs)} inputs and {len(model.outputs)} outputs, "
            f"the saved records {len(inputs.paths)} and {len(output_dtypes)}"
        )
    ports = [
        *((port, dtype, True) for port, dtype in zip(model.inputs, inputs.dtypes, strict=True)),
        *((port, dtype, False) for port, dtype in zip(model.outputs, output_dtypes, strict=True)),
    ]
    for port, dtype, exact in ports:
        try:
            declared = port.get_element_type().to_dtype()
        except Exception:  # a dynamic element type: OpenVINO takes what it is given
            continue
        if not carries(declared, dtype, exact=exact):
            raise BackendError(
                f"OpenVINO model's {port.get_any_name()!r} is {declared}, the saved record "
                f"says {dtype}: the saved runner does not fit its graph"
            )
    bounds: list[list[AxisBounds] | None] = []
    for port in model.inputs:
        shape = port.get_partial_shape()
        if shape.rank.is_dynamic:
            bounds.append(None)
            continue
        axes: list[AxisBounds] = []
        for dim in shape:
            if dim.is_static:
                axes.append((dim.get_length(), dim.get_length()))
            else:
                high = dim.get_max_length()
                axes.append((max(dim.get_min_length(), 0), high if high >= 0 else None))
        bounds.append(axes)
    return narrowed_to_artifact(key, inputs.specs(key), bounds, "the saved OpenVINO model")


@dataclasses.dataclass(frozen=True)
class OpenVINOBf16(OpenVINO, ChangesResults):
    """OpenVINO computing in bf16 (or f16 with ``precision="f16"``).

    Much faster on CPUs with bf16 units, but results change by about 1e-2, so it is never
    chosen by default. It is checked with its own looser tolerances ``atol`` and ``rtol``
    (keyword-only, from :class:`~tunetree.backends.base.ChangesResults`).

    Args:
        device: As for :class:`OpenVINO`.
        precision: ``"bf16"`` or ``"f16"``.
        performance_hint: As for :class:`OpenVINO`.
        num_streams: As for :class:`OpenVINO`.
        num_threads: As for :class:`OpenVINO`.
        atol: Absolute tolerance against eager.
        rtol: Relative tolerance against eager.

    Raises:
        InvalidInputError: A precision other than bf16 or f16.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.OpenVINOBf16(precision="f16", atol=0.1).tolerances().by_dtype
        ... # doctest: +ELLIPSIS
        {...}
    """

    kind: ClassVar[str] = "openvino-bf16"
    precision: str = "bf16"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.precision not in ("bf16", "f16"):
            raise InvalidInputError(
                f"OpenVINOBf16 precision must be 'bf16' or 'f16', not {self.precision!r}"
            )

    def unavailable_reason(self, device: torch.device) -> str | None:
        """OpenVINO's reasons, plus a CPU without bf16 units when ``precision`` is bf16."""
        reason = super().unavailable_reason(device)
        if reason is not None:
            return reason
        target = self.openvino_device(device)
        if target.split(".")[0] == "CPU" and self.precision == "bf16":
            capabilities = list(_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
            if "BF16" not in capabilities:
                return "this CPU has no bf16 units: OpenVINO would compute in f32 (use OpenVINO())"
        return None


def _convert(flat: FlatGraph, module: nn.Module) -> tuple[Any, Any]:
    """The graph as an OpenVINO model, and what it may share memory with.

    Converted through ``torch.export`` (with the graph's ranges as dynamic shapes), else by
    tracing. A module that branches on tensor values fails here (:mod:`.value_dependence`).
    Weights are read on the host; the module's parameters stay where they were.
    """
    openvino = load_openvino()
    example = tuple(t.cpu() for t in flat.example)
    with (
        exporting(module),
        parameters_on_cpu(module),
        attention_as_eager(expand_gqa=True, null_key=True),
        empty_operands_dropped(),
        quiet(),
    ):
        try:
            exported = export_ranged(flat.module, example, flat.key)
            with private_home():
                return openvino.convert_model(exported), exported
        except Exception as export_error:
            reason = data_dependent_reason(export_error)
            if reason is not None:
                raise ValueDependentError(reason) from export_error
            log.debug("torch.export route failed, tracing instead: %r", export_error)
            try:
                with traced_values_checked("tracing"), private_home():
                    model = openvino.convert_model(flat.module, example_input=example)
                return model, None
            except ValueDependentError:
                raise
            except Exception as trace_error:
                raise BackendError(
                    "OpenVINO could not convert the module: torch.export failed with "
                    f"{describe_error(export_error)}, tracing with {describe_error(trace_error)}"
                ) from trace_error


def _set_input_shapes(model: Any, inputs: FlatInputs, dims: list[AxisDims]) -> None:
    """Give every input of the converted model the graph's shape.

    Fixed sizes, and ``Dimension(min, max)`` on exactly the dynamic axes of a ranged graph
    (conversion leaves every axis dynamic). Known shapes let OpenVINO plan memory and pick
    kernels once; bounds keep that for ranges.
    """
    import openvino

    try:
        model.reshape(
            {
                port: openvino.PartialShape(
                    [
                        openvino.Dimension(axes[axis].min, axes[axis].max) if axis in axes else size
                        for axis, size in enumerate(shape)
                    ]
                )
                for port, shape, axes in zip(model.inputs, inputs.shapes, dims, strict=True)
            }
        )
    except Exception as exc:  # the model stays fully dynamic: slower, still correct
        log.debug("could not set the OpenVINO model's input shapes: %r", exc)
