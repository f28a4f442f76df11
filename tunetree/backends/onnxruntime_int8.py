"""ONNX Runtime with dynamic int8 quantization: an opt-in candidate that changes results.

The module is exported exactly as for :class:`~tunetree.backends.onnxruntime.OnnxRuntime`;
``onnxruntime.quantization.quantize_dynamic`` then stores the weights of its MatMul (and
Gemm) nodes in int8 and quantizes their activations on every call (MLAS's u8s8 kernels),
and the session runs the quantized file. It is the reduced-precision candidate for CPUs
without bf16 units (AVX2-only CPUs), where OpenVINO bf16 and bf16 autocast do not help.

The default tolerance, 0.1 absolute plus 0.1 relative, leaves a margin of 3 to 4 over the
errors measured on small transformers (docs/measurements.md); it refuses a graph that
quantization breaks, but it is no accuracy measure: an accuracy budget is.

ONNX Runtime's own pre-processing (``quant_pre_process``) is not run: its symbolic shape
inference fails on the dynamo exporter's BERT, and with that step skipped it made the
quantized model no faster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import BackendError, InvalidInputError
from .base import ChangesResults
from .cpu_features import cpu_supports
from .export_context import describe_error, quiet
from .flat import FlatGraph
from .onnxruntime import MODEL_FILE, OnnxRuntime
from .packages import install_hint
from .safe_config import check_choice, refuse

WEIGHT_TYPES = ("qint8", "quint8")
"""Element types of the quantized weights: signed (the default, what MLAS's u8s8 kernels
take) or unsigned int8."""

OP_TYPES = ("MatMul", "Gemm", "Conv", "Gather", "Attention", "LSTM", "EmbedLayerNormalization")
"""Node types whose weights ``quantize_dynamic`` may quantize. Its dynamic mode rewrites every
Gemm as a MatMul first, so ``"MatMul"`` quantizes both; ``"Gather"`` quantizes embedding
tables."""

_QUANTIZED_NODES = frozenset(
    {
        "MatMulInteger",
        "ConvInteger",
        "DynamicQuantizeLinear",
        "DynamicQuantizeMatMul",
        "DequantizeLinear",
        "QAttention",
        "DynamicQuantizeLSTM",
        "QEmbedLayerNormalization",
    }
)
"""Node types that only a quantized model holds."""

_MAX_TOLERANCE = 1e3


@dataclasses.dataclass(frozen=True, kw_only=True)
class OnnxRuntimeInt8(OnnxRuntime, ChangesResults):
    """ONNX Runtime over the exported model with int8 weights (dynamic quantization), CPU only.

    Changes results, so it is never chosen by default and is checked with its own ``atol`` and
    ``rtol``. Takes :class:`OnnxRuntime`'s session options first.

    Args:
        weight_type: ``"qint8"`` or ``"quint8"`` (keyword-only, as the rest).
        per_channel: Give each output channel its own scale.
        reduce_range: 7-bit weights, ONNX Runtime's advice for CPUs without VNNI, whose u8s8
            kernels can saturate (None: on exactly those CPUs, see :func:`saturating_cpu`).
        op_types: The node types whose weights are quantized (see :data:`OP_TYPES`).
        atol: Absolute tolerance against eager.
        rtol: Relative tolerance against eager.

    Raises:
        InvalidInputError: An unknown weight type or op type.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.OnnxRuntimeInt8(per_channel=True).preserves_results
        False
    """

    kind: ClassVar[str] = "onnxruntime-int8"
    typical_build_s: ClassVar[float | None] = 4.0  # an ONNX export, then quantization
    preserves_results: ClassVar[bool] = False
    weight_type: str = "qint8"
    per_channel: bool = False
    reduce_range: bool | None = None
    op_types: tuple[str, ...] = ("MatMul", "Gemm")
    atol: float = 1e-1
    rtol: float = 1e-1

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.op_types, str):
            object.__setattr__(self, "op_types", (self.op_types,))
        else:
            object.__setattr__(self, "op_types", tuple(self.op_types))
        if self.weight_type not in WEIGHT_TYPES:
            raise InvalidInputError(
                f"weight_type must be one of {', '.join(WEIGHT_TYPES)}, not {self.weight_type!r}"
            )
        unknown = [op for op in self.op_types if op not in OP_TYPES]
        if not self.op_types or unknown:
            raise InvalidInputError(
                f"op_types must name some of {', '.join(OP_TYPES)}, not {list(self.op_types)}"
            )
        if not isinstance(self.per_channel, bool):
            raise InvalidInputError("per_channel must be True or False")
        if self.reduce_range is not None and not isinstance(self.reduce_range, bool):
            raise InvalidInputError("reduce_range must be True, False or None (by the CPU)")
        if not all(_is_tolerance(t) for t in (self.atol, self.rtol)):
            raise InvalidInputError(
                f"atol and rtol must be numbers in 0..{_MAX_TOLERANCE:g}, "
                f"not {self.atol!r} and {self.rtol!r}"
            )

    @classmethod
    def check_saved_config(cls, config: Any) -> None:
        """:class:`OnnxRuntime`'s checks, plus known quantization options and finite tolerances."""
        super().check_saved_config(config)
        check_choice(cls.kind, "weight_type", config.get("weight_type", "qint8"), WEIGHT_TYPES)
        check_choice(cls.kind, "per_channel", config.get("per_channel", False), (True, False))
        check_choice(cls.kind, "reduce_range", config.get("reduce_range"), (True, False, None))
        op_types = config.get("op_types", list(OP_TYPES[:2]))
        if not isinstance(op_types, list) or not 0 < len(op_types) <= len(OP_TYPES):
            raise refuse(cls.kind, "op_types", "is not a short list of node types")
        for op in op_types:
            check_choice(cls.kind, "op_types", op, OP_TYPES)
        for field in ("atol", "rtol"):
            if not _is_tolerance(config.get(field, 0.0)):
                raise refuse(cls.kind, field, f"is not a number in 0..{_MAX_TOLERANCE:g}")

    def reduces_range(self) -> bool:
        """Whether weights are quantized to 7 bits: ``reduce_range``, or by the CPU when None."""
        return saturating_cpu() if self.reduce_range is None else self.reduce_range

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why it cannot run on ``device``: not a CPU, or packages missing."""
        if device.type != "cpu":
            return (
                "ONNX Runtime's dynamic int8 quantization runs on the CPU only (its int8 "
                f"kernels are the CPU provider's), not on {device.type!r}"
            )
        reason = super().unavailable_reason(device)
        if reason is not None:
            return reason
        try:
            import onnxruntime.quantization  # noqa: F401
        except Exception as exc:  # a partial install can fail in many ways
            return (
                f"onnxruntime.quantization cannot be imported ({type(exc).__name__}: "
                f"{str(exc)[:120]}): {install_hint(self)}"
            )
        return None

    def write_model(self, flat: FlatGraph, module: nn.Module, directory: Path) -> None:
        """Export to a scratch directory, then write the quantized model into ``directory``.

        Only the quantized files reach ``directory``, so a saved runner holds those alone.
        """
        with tempfile.TemporaryDirectory(prefix="tunetree-onnx-fp32-") as scratch:
            super().write_model(flat, module, Path(scratch))
            self.quantize(Path(scratch) / MODEL_FILE, directory / MODEL_FILE)

    def quantize(self, source: Path, target: Path) -> None:
        """Quantize the ONNX model ``source`` into ``target`` (weights in ``target.data``).

        BackendError when quantization fails or quantizes no node.
        """
        import onnxruntime
        from onnxruntime.quantization import QuantType, quantize_dynamic

        weight_type = QuantType.QInt8 if self.weight_type == "qint8" else QuantType.QUInt8
        with quiet(), _root_records_dropped(onnxruntime):
            try:
                quantize_dynamic(
                    source,
                    target,
                    op_types_to_quantize=list(self.op_types),
                    per_channel=self.per_channel,
                    reduce_range=self.reduces_range(),
                    weight_type=weight_type,
                    use_external_data_format=True,  # no 2 GB protobuf limit
                )
            except Exception as exc:
                raise BackendError(
                    f"ONNX Runtime's quantize_dynamic failed: {describe_error(exc)}"
                ) from exc
        if not quantized_nodes(target):
            raise BackendError(
                f"quantize_dynamic quantized no node (op_types {list(self.op_types)} with constant "
                "weights): the model would run unquantized"
            )


def saturating_cpu() -> bool:
    """Whether this CPU lacks VNNI, so full-range u8s8 products can saturate.

    Without VNNI, MLAS multiplies u8 activations by s8 weights with ``vpmaddubsw``, whose 16-bit
    sums of two products saturate; ONNX Runtime advises 7-bit weights there (full-range int8
    breaks the default tolerance on such CPUs, docs/measurements.md). Unknown (a torch without
    the check) counts as lacking it.
    """
    return not cpu_supports("_is_vnni_supported")


def quantized_nodes(model_file: Path) -> dict[str, int]:
    """How many nodes of each quantized type (``MatMulInteger`` ...) the model file holds."""
    import onnx

    model = onnx.load(str(model_file), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in _QUANTIZED_NODES:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _is_tolerance(value: Any) -> bool:
    """A real number in ``0.._MAX_TOLERANCE``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and 0 <= value <= _MAX_TOLERANCE


class _FromDirectory(logging.Filter):
    """Drops the records logged from source files under one directory."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep records from anywhere else."""
        return not record.pathname.startswith(self.directory)


@contextlib.contextmanager
def _root_records_dropped(package: Any) -> Iterator[None]:
    """Drop what ``package`` logs on the root logger while the block runs; configure nothing.

    ONNX Runtime's quantizer logs through ``logging.warning`` and ``logging.info``, which call
    ``logging.basicConfig()`` when the root logger has no handler: that would leave a stderr
    handler on the user's root logger. Meanwhile a handler that drops everything stands in
    (only where the root has none), and a filter keeps the package's records from the user's
    handlers. Both are removed afterwards.
    """
    root = logging.getLogger()
    dropped = _FromDirectory(os.path.dirname(os.path.abspath(package.__file__)) + os.sep)
    stand_in = None if root.handlers else logging.NullHandler()
    root.addFilter(dropped)
    if stand_in is not None:
        root.addHandler(stand_in)
    try:
        yield
    finally:
        root.removeFilter(dropped)
        if stand_in is not None:
            root.removeHandler(stand_in)
