"""ONNX Runtime: exports the module to ONNX and runs it in an ``onnxruntime.InferenceSession``.

The export uses torch's dynamo ONNX exporter; the session uses the CPU provider, or the
CUDA provider on CUDA devices.

The legacy TorchScript exporter is only a fallback for modules ``torch.export`` refuses
(data-dependent Python control flow): it fails on Hugging Face BERT and on the fused
``nn.TransformerEncoder`` fast path.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import BackendError, InvalidInputError
from ..signature.graph import Dim, Graph, GraphKey
from .base import Backend, Runner
from .dtypes import as_numpy, as_torch, carries, check_numpy_dtypes, numpy_dtype
from .export_context import attention_as_eager, describe_error, exporting, quiet
from .files import artifact_file, copy_files
from .flat import FlatGraph, FlatInputs, FlatOutputs, check_saved_io, saved_outputs
from .onnx_content import check_external_data, reduced_precision, refused_by_onnxruntime
from .packages import not_installed_reason
from .ranges import AxisBounds, axis_dims, export_dynamic_shapes, narrowed_to_artifact
from .safe_config import check_choice, check_count, check_fields, refuse
from .value_dependence import ValueDependentError, data_dependent_reason, traced_values_checked

MODEL_FILE = "model.onnx"
"""The model file a session opens, in the runner's directory (weights in data files beside it)."""
PROVIDERS = (
    "CPUExecutionProvider",
    "CUDAExecutionProvider",
    "TensorrtExecutionProvider",
    "ROCMExecutionProvider",
    "MIGraphXExecutionProvider",
    "OpenVINOExecutionProvider",
    "DnnlExecutionProvider",
    "XnnpackExecutionProvider",
    "CoreMLExecutionProvider",
    "DmlExecutionProvider",
)
"""Execution providers a saved config may name (providers are chosen by name only: no
provider options, which can name libraries and paths, are ever read from a file)."""

_OPTIMIZATION_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}


class OnnxRuntimeRunner(Runner):
    """An ONNX Runtime session over a model file in a directory the runner owns.

    The directory is removed when the runner is garbage collected. On the CPU inputs go in as
    numpy views and the session's new output arrays come back without a copy; on CUDA inputs
    and outputs are bound in device memory (IO binding), outputs freshly allocated on every
    call.
    """

    def __init__(
        self,
        backend: OnnxRuntime,
        directory: Path,
        inputs: FlatInputs,
        outputs: FlatOutputs,
        device: torch.device,
        dynamic: bool = False,
    ) -> None:
        super().__init__(backend)
        self.directory = directory
        self.device = device
        self.bind = device.type == "cuda"
        self.spinning = backend.allow_spinning and not self.bind
        """Whether the session's threads spin between calls (only after :meth:`serve_alone`
        or with ``allow_spinning=True``)."""
        self.dynamic = dynamic  # output shapes vary with the call: ONNX Runtime allocates
        weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)
        self.session = self._session(backend.session_options())
        index = {name: i for i, name in enumerate(inputs.names)}
        try:
            # The exporter may drop inputs the graph never reads.
            self.feeds = [(i.name, index[i.name]) for i in self.session.get_inputs()]
        except KeyError as exc:
            raise BackendError(f"ONNX model has an unexpected input {exc}") from exc
        self.output_names = [o.name for o in self.session.get_outputs()]
        if len(self.output_names) != len(outputs.positions):
            raise BackendError(
                f"ONNX model has {len(self.output_names)} outputs, eager {len(outputs.positions)}"
            )
        self.numpy_in = [numpy_dtype(inputs.dtypes[i]) for _, i in self.feeds]
        self.numpy_out = [numpy_dtype(d) for d in outputs.dtypes]
        self.inputs = inputs
        self.outputs = outputs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Pick the input tensors, run the session and rebuild eager's output structure."""
        tensors = self.inputs.pick(args, kwargs)
        if self.bind:
            return self.outputs.rebuild(self._run_bound(tensors), (args, kwargs))
        feeds = {name: as_numpy(tensors[i]) for name, i in self.feeds}
        try:
            arrays = self.session.run(self.output_names, feeds)
        except Exception as exc:  # onnxruntime's own error types derive from Exception only
            raise BackendError(
                f"ONNX Runtime refused this call ({str(exc).strip()[:300]}); the runner "
                "serves only calls inside its graph"
            ) from exc
        return self.outputs.rebuild(
            [
                as_torch(array, dtype, self.device)
                for array, dtype in zip(arrays, self.outputs.dtypes, strict=True)
            ],
            (args, kwargs),
        )

    def _session(self, options: Any) -> Any:
        import onnxruntime

        backend = self.backend
        assert isinstance(backend, OnnxRuntime)
        try:
            return onnxruntime.InferenceSession(
                str(self.directory / MODEL_FILE),
                sess_options=options,
                providers=backend.session_providers(self.device),
            )
        except Exception as exc:  # onnxruntime's own errors derive from Exception only
            raise BackendError(refused_by_onnxruntime(exc)) from exc

    def serve_alone(self) -> None:
        """Let the session's threads spin between calls: the process serves this model only.

        Only when the user asks (:func:`tunetree.serve_alone`): spinning serves the whole model
        faster, but any torch code between calls pays for it, several times over on a small
        CPU (docs/measurements.md). The session is rebuilt once, from the same model file.
        """
        backend = self.backend
        assert isinstance(backend, OnnxRuntime)
        if self.spinning or self.bind:
            return
        self.session = self._session(backend.session_options(spinning=True))
        self.spinning = True

    def _run_bound(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run with inputs and outputs in device memory (no host round trip)."""
        binding = self.session.io_binding()
        keep = []
        for (name, i), np_dtype in zip(self.feeds, self.numpy_in, strict=True):
            tensor = tensors[i].detach().to(self.device).contiguous()
            keep.append(tensor)
            binding.bind_input(
                name,
                tensor.device.type,
                tensor.device.index or 0,
                np_dtype,
                list(tensor.shape),
                tensor.data_ptr(),
            )
        if self.dynamic:
            return self._run_bound_dynamic(binding)
        results = [
            torch.empty(shape, dtype=dtype, device=self.device)
            for shape, dtype in zip(self.outputs.shapes, self.outputs.dtypes, strict=True)
        ]
        for name, result, np_dtype in zip(self.output_names, results, self.numpy_out, strict=True):
            binding.bind_output(
                name,
                result.device.type,
                result.device.index or 0,
                np_dtype,
                list(result.shape),
                result.data_ptr(),
            )
        # ONNX Runtime runs on its own stream: let torch's pending work finish first.
        torch.cuda.current_stream(self.device).synchronize()
        self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return results

    def _run_bound_dynamic(self, binding: Any) -> list[torch.Tensor]:
        """Run a ranged graph with inputs bound; ONNX Runtime allocates the outputs on the device.

        Output shapes depend on the call, so ONNX Runtime allocates them; they come back through
        DLPack (a host copy where this onnxruntime lacks it).
        """
        for name in self.output_names:
            binding.bind_output(name, self.device.type, self.device.index or 0)
        torch.cuda.current_stream(self.device).synchronize()
        self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        results = []
        for value, dtype in zip(binding.get_outputs(), self.outputs.dtypes, strict=True):
            if hasattr(value, "to_dlpack"):
                results.append(torch.from_dlpack(value.to_dlpack()).clone())
            else:
                results.append(as_torch(value.numpy(), dtype, self.device))
        return results

    def save(self, directory: Path) -> dict[str, Any]:
        """Copy the model files into ``directory`` and record them with the I/O records."""
        files = sorted(p.name for p in self.directory.iterdir() if p.is_file())
        copy_files(self.directory, directory, files)
        return {
            "model": MODEL_FILE,
            "files": files,
            "inputs": self.inputs.to_json(),
            "outputs": self.outputs.to_json(),
        }


@dataclasses.dataclass(frozen=True)
class OnnxRuntime(Backend):
    """ONNX Runtime over a dynamo-exported ONNX model.

    Args:
        graph_optimization_level: One of disable, basic, extended, layout, all.
        intra_op_num_threads: Threads within an op (None: ONNX Runtime chooses).
        inter_op_num_threads: Threads across ops (None: ONNX Runtime chooses).
        allow_spinning: Let the pool's idle threads spin: only for a process that serves this
            model alone (see :func:`tunetree.serve_alone`); by default they sleep, so they take
            no core from the code that runs between calls.
        providers: Execution providers (default: CPU, or CUDA then CPU on a CUDA device).

    Raises:
        InvalidInputError: An unknown optimization level.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.OnnxRuntime(intra_op_num_threads=2).extra
        'onnx'
    """

    kind: ClassVar[str] = "onnxruntime"
    typical_build_s: ClassVar[float | None] = 1.5  # docs/measurements.md
    extra: ClassVar[str | None] = "onnx"
    libraries: ClassVar[tuple[str, ...]] = ("onnxruntime", "onnx", "onnxscript")
    load_imports: ClassVar[tuple[str, ...]] = ("onnx", "onnxruntime")
    """``onnx`` imports ``ml_dtypes``, whose extension holds the GIL about 1 s as it loads."""
    graph_optimization_level: str = "all"
    intra_op_num_threads: int | None = None
    inter_op_num_threads: int | None = None
    allow_spinning: bool = False
    providers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.graph_optimization_level not in _OPTIMIZATION_LEVELS:
            raise InvalidInputError(
                f"graph_optimization_level must be one of {', '.join(_OPTIMIZATION_LEVELS)}, "
                f"not {self.graph_optimization_level!r}"
            )
        if isinstance(self.providers, str):
            object.__setattr__(self, "providers", (self.providers,))
        elif self.providers is not None:
            object.__setattr__(self, "providers", tuple(self.providers))

    @classmethod
    def check_saved_config(cls, config: Any) -> None:
        """Known fields; a known level; thread counts in 0..1024; providers by known name."""
        check_fields(cls.kind, cls, config)
        level = config.get("graph_optimization_level", "all")
        check_choice(cls.kind, "graph_optimization_level", level, tuple(_OPTIMIZATION_LEVELS))
        check_count(cls.kind, "intra_op_num_threads", config.get("intra_op_num_threads"))
        check_count(cls.kind, "inter_op_num_threads", config.get("inter_op_num_threads"))
        check_choice(cls.kind, "allow_spinning", config.get("allow_spinning", False), (True, False))
        providers = config.get("providers")
        if providers is None:
            return
        if not isinstance(providers, list) or not 0 < len(providers) <= len(PROVIDERS):
            raise refuse(cls.kind, "providers", "is not a short list of provider names")
        for name in providers:
            check_choice(cls.kind, "providers", name, PROVIDERS)

    def provider_names(self, device: torch.device) -> list[str]:
        """Execution providers used for graphs on ``device``, in priority order."""
        if self.providers is not None:
            return list(self.providers)
        if device.type == "cuda":
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def session_providers(self, device: torch.device) -> list[Any]:
        """Providers as ``InferenceSession`` takes them (the CUDA one on the device's index)."""
        result: list[Any] = []
        for name in self.provider_names(device):
            if name == "CUDAExecutionProvider" and device.type == "cuda":
                result.append((name, {"device_id": device.index or 0}))
            else:
                result.append(name)
        return result

    def session_options(self, spinning: bool | None = None) -> Any:
        """``onnxruntime.SessionOptions`` for this configuration.

        ``spinning`` overrides ``allow_spinning`` (see :meth:`OnnxRuntimeRunner.serve_alone`).
        """
        import onnxruntime

        options = onnxruntime.SessionOptions()
        level = _OPTIMIZATION_LEVELS[self.graph_optimization_level]
        if not hasattr(onnxruntime.GraphOptimizationLevel, level):
            raise BackendError(
                "this onnxruntime has no graph optimization level "
                f"{self.graph_optimization_level!r}"
            )
        options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, level)
        if self.intra_op_num_threads is not None:
            options.intra_op_num_threads = self.intra_op_num_threads
        if self.inter_op_num_threads is not None:
            options.inter_op_num_threads = self.inter_op_num_threads
        # No spinning by default, not even within a call: threads that spin only while a
        # call runs (session.force_spinning_stop) still take cores from other processes'
        # work (benchmarks/serving.py measures it).
        spin = "1" if (self.allow_spinning if spinning is None else spinning) else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        options.add_session_config_entry("session.inter_op.allow_spinning", spin)
        # Fatal only: ONNX Runtime's C++ logger writes a failed call's error straight to
        # stderr ("[E:onnxruntime:...] Non-zero status code ..."), past logging, while the same
        # message comes back in the exception, which the candidate's row keeps.
        options.log_severity_level = 4
        return options

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why ONNX Runtime cannot run on ``device``: missing packages, device or providers."""
        missing = not_installed_reason(self, "onnxruntime", "onnx", "onnxscript")
        if missing is not None:
            return missing
        if device.type not in ("cpu", "cuda"):
            return f"the ONNX Runtime backend runs on cpu and cuda devices, not {device.type!r}"
        import onnxruntime

        available = onnxruntime.get_available_providers()
        lacking = [p for p in self.provider_names(device) if p not in available]
        if lacking:
            cuda = "CUDAExecutionProvider" in lacking
            hint = " (install onnxruntime-gpu for CUDA)" if cuda else ""
            return f"onnxruntime here lacks {', '.join(lacking)}{hint}; it has {available}"
        return None

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        """Export the flat graph to ONNX in a new directory and open a session on it."""
        flat = FlatGraph.of(module, graph)
        flat.check_numpy_dtypes()
        directory = Path(tempfile.mkdtemp(prefix="tunetree-onnx-"))
        try:
            self.write_model(flat, module, directory)
            runner = OnnxRuntimeRunner(
                self, directory, flat.inputs, flat.outputs, device, flat.key.is_dynamic
            )
            _check_ranges_kept(runner, flat)
            return runner
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise

    def write_model(self, flat: FlatGraph, module: nn.Module, directory: Path) -> None:
        """Write the model the session opens: ``directory/model.onnx`` and its data files.

        Here the flat graph as exported; a variant may transform the export (see
        :class:`~tunetree.backends.onnxruntime_int8.OnnxRuntimeInt8`).
        """
        _export(flat, module, directory)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        """Check the saved files and records (:func:`_read_saved`), then open a copy of them.

        The copy lives in the runner's own directory.
        """
        files, inputs, served = _read_saved(directory, saved, key, self.preserves_results)
        outputs = FlatOutputs.from_json(saved.get("outputs"), module, key, device)
        # The runner owns a copy (hard links where possible): the checkpoint's directory may
        # be temporary, and the runner can save itself again later.
        own = Path(tempfile.mkdtemp(prefix="tunetree-onnx-"))
        try:
            copy_files(directory, own, files)
            runner = OnnxRuntimeRunner(self, own, inputs, outputs, device, key.is_dynamic)
        except BaseException:
            shutil.rmtree(own, ignore_errors=True)
            raise
        if served is not key:
            runner.served = served
        return runner

    def check_saved_runner(self, key: GraphKey, saved: Any, max_elements: int) -> None:
        """The I/O records against ``key`` (:func:`.check_saved_io`)."""
        check_saved_io(key, saved, max_elements)

    def check_saved_artifacts(
        self, key: GraphKey, directory: Path, saved: dict[str, Any]
    ) -> GraphKey | None:
        """The part of ``key`` the saved model serves: :func:`_read_saved`, as ``load`` runs it.

        Then an ONNX Runtime session is opened on the model, on the CPU, as ``load`` opens
        one: a model ONNX Runtime refuses (an operator of an unknown domain, a path it will
        not read) is refused here too, so ``tunetree info`` agrees with ``tt.load``.
        """
        served = _read_saved(directory, saved, key, self.preserves_results)[2]
        import onnxruntime

        try:
            onnxruntime.InferenceSession(
                str(directory / MODEL_FILE),
                sess_options=self.session_options(),
                providers=["CPUExecutionProvider"],
            )
        except Exception as exc:  # onnxruntime's own errors derive from Exception only
            raise BackendError(refused_by_onnxruntime(exc)) from exc
        return served


_ONNX_TYPES = {
    1: "float32",
    11: "float64",
    10: "float16",
    7: "int64",
    6: "int32",
    5: "int16",
    3: "int8",
    2: "uint8",
    9: "bool",
}
"""ONNX element types (``onnx.TensorProto.DataType`` numbers), as numpy names."""

PortShape = list[int | str | None] | None
"""An ONNX value's declared shape: per axis a size, a symbolic name or None (unknown); None
for an unknown rank."""


def _read_saved(
    directory: Path, saved: dict[str, Any], key: GraphKey, keeps_results: bool
) -> tuple[list[str], FlatInputs, GraphKey]:
    """The saved files, the input record and the part of ``key`` the model serves.

    Read without the module: the file names are checked (:func:`.artifact_file`), the model's
    graph is parsed without its weights (:func:`read_graph`), the input record is checked
    against ``key`` and the graph against both records (:func:`_served_by`). Both ``load``
    and ``tunetree info`` (through :meth:`OnnxRuntime.check_saved_artifacts`) run this.
    BackendError on a mismatch.
    """
    files = saved.get("files")
    if not isinstance(files, list) or not 0 < len(files) <= 4096:
        raise BackendError("saved ONNX Runtime runner record lists no files")
    paths = [artifact_file(directory, name) for name in files]
    if MODEL_FILE not in files:
        raise BackendError(f"saved ONNX Runtime runner lists no {MODEL_FILE}")
    graph = read_graph(paths[files.index(MODEL_FILE)], set(files), keeps_results)
    inputs = FlatInputs.from_json(saved.get("inputs"))
    inputs.check_against(key)
    _, _, _, dtypes, shapes = saved_outputs(saved.get("outputs"))
    check_numpy_dtypes((*inputs.dtypes, *dtypes))
    return files, inputs, _served_by(graph, inputs, dtypes, shapes, key)


def _served_by(
    graph: Any,
    inputs: FlatInputs,
    output_dtypes: Sequence[torch.dtype],
    output_shapes: Sequence[tuple[int, ...]],
    key: GraphKey,
) -> GraphKey:
    """The part of ``key`` an ONNX graph serves, checked against what it declares.

    Its inputs (those a session takes: the graph's inputs but initializers) must be named in
    the input record, its outputs as many as the output record's; every one of the element
    type its record says, outputs of the recorded ranks and fixed sizes; the inputs' fixed
    sizes narrow ``key``'s ranges (a symbolic axis takes any size). BackendError on a
    mismatch.
    """
    initializers = {t.name for t in graph.initializer}
    ports_in = [p for p in graph.input if p.name not in initializers]
    index = {name: i for i, name in enumerate(inputs.names)}
    unexpected = [p.name for p in ports_in if p.name not in index]
    if unexpected:
        raise BackendError(f"ONNX model has an unexpected input {unexpected[0][:80]!r}")
    if len(graph.output) != len(output_dtypes):
        raise BackendError(
            f"ONNX model has {len(graph.output)} outputs, the saved record {len(output_dtypes)}"
        )
    feeds = [index[p.name] for p in ports_in]
    ports = [(p, inputs.dtypes[i], True) for p, i in zip(ports_in, feeds, strict=True)]
    ports += [(p, d, False) for p, d in zip(graph.output, output_dtypes, strict=True)]
    for port, dtype, exact in ports:
        declared = _ONNX_TYPES.get(port.type.tensor_type.elem_type)
        if declared is not None and not carries(declared, dtype, exact=exact):
            raise BackendError(
                f"ONNX model's {port.name[:80]!r} is {declared}, the saved record says "
                f"{dtype}: the saved runner does not fit its graph"
            )
    for port, shape in zip(graph.output, output_shapes, strict=True):
        fixed = _port_shape(port)
        if fixed is not None and (
            len(fixed) != len(shape)
            or any(isinstance(d, int) and d != n for d, n in zip(fixed, shape, strict=True))
        ):
            raise BackendError(
                f"ONNX model's output {port.name[:80]!r} has shape {fixed}, the saved record "
                f"{list(shape)}: the saved runner does not fit its graph"
            )
    bounds: list[list[AxisBounds] | None] = []
    for port in ports_in:
        declared_shape = _port_shape(port)
        bounds.append(
            None
            if declared_shape is None
            else [(d, d) if isinstance(d, int) else (1, None) for d in declared_shape]
        )
    specs = [inputs.specs(key)[i] for i in feeds]
    return narrowed_to_artifact(key, specs, bounds, "the saved ONNX model")


def _check_ranges_kept(runner: OnnxRuntimeRunner, flat: FlatGraph) -> None:
    """Refuse an export that fixed the size of an axis the graph's calls vary.

    The exporter is given the graph's ranges, but a module that reads a size as a Python
    number (MobileNetV2's TF padding: ``int(features.shape[-2])``) is exported with the
    example's size there, and the session then refuses every other size. Said at build,
    with the axis, instead of as a run failure on the first call of another size. Reads the
    shapes the open session declares for its inputs (:attr:`OnnxRuntimeRunner.feeds`).
    """
    if not flat.key.is_dynamic:
        return
    specs = flat.inputs.specs(flat.key)
    for port, (name, i) in zip(runner.session.get_inputs(), runner.feeds, strict=True):
        spec, declared = specs[i], port.shape
        if len(declared) != len(spec.shape):
            continue  # the session's own check names a rank mismatch
        for axis, (size, fixed) in enumerate(zip(spec.shape, declared, strict=True)):
            if isinstance(size, Dim) and isinstance(fixed, int) and size.min != size.max:
                raise BackendError(
                    f"the ONNX export fixed axis {axis} of input {name[:80]!r} to {fixed}, "
                    f"where the recorded calls take {size.min}..{size.max} ({size.name}): the "
                    "module turns that size into a Python number while exporting (such as "
                    "int(x.shape[-1])), so ONNX Runtime would refuse every other size; tune "
                    "on calls of one size there, or let another backend serve this graph"
                )


def _port_shape(port: Any) -> PortShape:
    """The shape an ONNX graph input or output declares (see :data:`PortShape`)."""
    tensor = port.type.tensor_type
    if not port.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim
    ]


def _export(flat: FlatGraph, module: nn.Module, directory: Path) -> None:
    """Export the flat graph to ``directory/model.onnx``, with a fallback exporter.

    First with the dynamo exporter (weights in external data files, the graph's ranges as
    dynamic shapes); where that fails for another reason than branching on tensor values, with
    the legacy TorchScript exporter, which traces (dynamic axes named after the graph's
    dimensions; a module that converts a tensor to a Python value fails, see
    :mod:`.value_dependence`).
    """
    path = str(directory / MODEL_FILE)
    output_names = [f"output_{i}" for i in range(len(flat.outputs.positions))]
    input_names = list(flat.inputs.names)
    with exporting(module), attention_as_eager(), quiet():
        try:
            torch.onnx.export(
                flat.module,
                flat.example,
                path,
                dynamo=True,
                external_data=True,
                verbose=False,
                report=False,
                artifacts_dir=str(directory),
                input_names=input_names,
                output_names=output_names,
                dynamic_shapes=export_dynamic_shapes(flat.key),
            )
        except Exception as dynamo_error:
            reason = data_dependent_reason(dynamo_error)
            if reason is not None:
                raise ValueDependentError(reason) from dynamo_error
            _empty(directory)
            try:
                with traced_values_checked("the TorchScript exporter's tracing"):
                    torch.onnx.export(
                        flat.module,
                        flat.example,
                        path,
                        dynamo=False,
                        input_names=input_names,
                        output_names=output_names,
                        dynamic_axes=_dynamic_axes(flat) or None,
                    )
            except ValueDependentError:
                raise
            except Exception as legacy_error:
                raise BackendError(
                    "ONNX export failed: the dynamo exporter with "
                    f"{describe_error(dynamo_error)}, the TorchScript exporter with "
                    f"{describe_error(legacy_error)}"
                ) from dynamo_error
    if not (directory / MODEL_FILE).is_file():
        raise BackendError("torch.onnx.export wrote no model file")


def read_graph(model_file: Path, files: set[str], keeps_results: bool = False) -> Any:
    """The graph of a saved ONNX model, parsed with ``onnx.load`` without its external data.

    Refuses a model whose tensors name external data files other than the runner's
    ``files``, wherever a tensor can sit (:func:`.onnx_content.check_external_data`): a path
    in the model could point anywhere on the disk. With ``keeps_results`` (the record's kind
    says the runner keeps results), refuses a model whose content computes in reduced
    precision (:func:`.onnx_content.reduced_precision`).
    """
    import onnx

    try:
        model = onnx.load(str(model_file), load_external_data=False)
    except Exception as exc:
        raise BackendError(f"saved ONNX model cannot be parsed: {type(exc).__name__}") from exc
    check_external_data(model, files)
    if keeps_results:
        found = reduced_precision(model)
        if found is not None:
            raise BackendError(
                f"the saved ONNX model {found}, so it changes results, but its record says it "
                "is a results-keeping onnxruntime runner: the kind comes from the content, "
                "not the record (refused)"
            )
    return model.graph


def _empty(directory: Path) -> None:
    for leftover in directory.iterdir():
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()


def _dynamic_axes(flat: FlatGraph) -> dict[str, dict[int, str]]:
    """The TorchScript exporter's ``dynamic_axes``.

    Each input's dynamic axes named after their dimension, and each output axis whose size
    differs between recorded calls.
    """
    axes: dict[str, dict[int, str]] = {}
    for name, dims in zip(flat.inputs.names, axis_dims(flat.key), strict=True):
        if dims:
            axes[name] = {axis: dim.name for axis, dim in dims.items()}
    for i, varying in enumerate(flat.output_axes):
        if varying:
            axes[f"output_{i}"] = {axis: f"output_{i}_{axis}" for axis in varying}
    return axes
