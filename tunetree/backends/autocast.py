"""Mixed precision through ``torch.autocast``: an opt-in candidate that changes results.

Matrix products and convolutions run in bf16 (or fp16 on CUDA) while precision-sensitive
ops stay in float32, which is several times faster where the device has bf16 units
(large matmuls on a GPU, AVX-512 bf16 on CPUs). Outputs differ from eager by about 1e-2,
so the backend is never chosen by default and is checked with its own, looser tolerances.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree
from torch import nn

from ..errors import BackendError, InvalidInputError
from ..signature.binding import original_forward
from ..signature.graph import Graph, GraphKey, dtype_name, flatten, unflatten
from . import structure
from .base import ChangesResults, Runner
from .flat import MAX_SAVED_TENSORS, learn_output_spec
from .inductor import CUDA_GRAPH_MODES, MODES, compile_unavailable_reason, fresh_entry
from .safe_config import check_choice

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _output_dtypes(output: Any) -> list[str | None]:
    """Dtype name of every output leaf (None for non-tensors), in flattening order."""
    leaves, _ = flatten(output)
    return [dtype_name(x.dtype) if isinstance(x, torch.Tensor) else None for x in leaves]


def _recorded_structure(spec: pytree.TreeSpec) -> list[Any] | None:
    """The output structure ``spec`` in the closed vocabulary (:mod:`.structure`), to be saved.

    None where it cannot be described as one (a dict with keys other than strings and
    integers): the record then lists dtypes only, as records of earlier releases do.
    """
    try:
        return structure.check(structure.describe(spec))
    except BackendError:
        return None


class AutocastRunner(Runner):
    """Runs the original (optionally compiled) forward under ``torch.autocast``.

    Floating-point outputs are cast back to the dtypes eager returned, so callers see eager's
    types.
    """

    def __init__(
        self,
        backend: Autocast,
        module: nn.Module,
        device: torch.device,
        output_dtypes: list[str | None],
        output_structure: list[Any] | None = None,
    ) -> None:
        super().__init__(backend)
        self.device_type = device.type
        self.dtype = _DTYPES[backend.dtype]
        forward: Callable[..., Any] = original_forward(module)
        self.forward = (
            torch.compile(fresh_entry(forward), dynamic=False, mode=backend.compile_mode)
            if backend.compile
            else forward
        )
        # CUDA graph replays overwrite their outputs: hand back copies.
        self.clone_outputs = backend.compile_mode in CUDA_GRAPH_MODES
        self.output_dtypes = output_dtypes
        self.output_structure = output_structure
        by_name = {dtype_name(dt): dt for dt in (torch.float64, torch.float32, *_DTYPES.values())}
        self._targets = [by_name.get(name) if name else None for name in output_dtypes]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the forward under autocast; floating-point outputs come back in eager's dtypes."""
        with torch.autocast(self.device_type, dtype=self.dtype):
            out = self.forward(*args, **kwargs)
        leaves, spec = flatten(out)
        if len(leaves) != len(self._targets):
            raise BackendError(
                f"the forward returned {len(leaves)} outputs under autocast but "
                f"{len(self._targets)} when tuned; tune this input again"
            )
        cast = [
            x.to(target)
            if isinstance(x, torch.Tensor) and target is not None and x.dtype != target
            else (x.clone() if self.clone_outputs and isinstance(x, torch.Tensor) else x)
            for x, target in zip(leaves, self._targets, strict=True)
        ]
        return unflatten(cast, spec)

    def save(self, directory: Path) -> dict[str, Any]:
        """Record eager's output dtypes and structure: there is nothing else to write.

        The structure says how many outputs the dtypes are for, so a record whose counts
        disagree is refused without the model (``tunetree info`` too).
        """
        # Nothing to write: the runner is the module's forward under a context manager.
        record: dict[str, Any] = {"output_dtypes": self.output_dtypes}
        if self.output_structure is not None:
            record["structure"] = self.output_structure
        return record


@dataclasses.dataclass(frozen=True)
class Autocast(ChangesResults):
    """``torch.autocast(device_type, dtype)`` around the original forward (changes results).

    Args:
        dtype: ``"bf16"`` (CPU and GPUs) or ``"fp16"`` (CUDA only).
        compile: Also ``torch.compile`` the forward.
        compile_mode: ``torch.compile``'s mode (e.g. ``"reduce-overhead"``: CUDA graphs too).
        atol: Absolute tolerance against eager (keyword-only).
        rtol: Relative tolerance against eager (keyword-only).

    Raises:
        InvalidInputError: An unknown dtype or compile mode, or a mode without ``compile``.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.Autocast("bf16", compile=True).preserves_results
        False
    """

    kind: ClassVar[str] = "autocast"
    typical_build_s: ClassVar[float | None] = 0.1  # wraps the forward; nothing is compiled
    dtype: str = "bf16"
    compile: bool = False
    compile_mode: str | None = None
    """``torch.compile``'s mode with ``compile=True`` (``"reduce-overhead"``: CUDA graphs)."""

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise InvalidInputError(
                f"Autocast dtype must be one of {', '.join(_DTYPES)}, not {self.dtype!r}"
            )
        if self.compile_mode not in MODES or (self.compile_mode and not self.compile):
            raise InvalidInputError(
                f"Autocast compile_mode must be one of {MODES} and needs compile=True, "
                f"not {self.compile_mode!r}"
            )

    @classmethod
    def check_saved_config(cls, config: Any) -> None:
        """Plain fields, a known dtype and a known compile mode."""
        super().check_saved_config(config)
        check_choice(cls.kind, "dtype", config.get("dtype", "bf16"), tuple(_DTYPES))
        check_choice(cls.kind, "compile_mode", config.get("compile_mode"), MODES)

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why autocast in this dtype (and compile, if asked) cannot run on ``device``, or None."""
        if device.type == "cuda":
            if not torch.cuda.is_available():
                return "CUDA is not available here (torch.cuda.is_available() is False)"
            if self.dtype == "bf16" and not torch.cuda.is_bf16_supported():
                return "this GPU has no bf16 support; use Autocast(dtype='fp16')"
        elif device.type == "cpu":
            if self.dtype == "fp16":
                return "fp16 autocast is offered on CUDA only; use Autocast(dtype='bf16') on CPU"
        elif not torch.amp.is_autocast_available(device.type):
            return f"torch.autocast does not support device type {device.type!r}"
        if self.compile_mode in CUDA_GRAPH_MODES and device.type != "cuda":
            return f"compile_mode={self.compile_mode!r} uses CUDA graphs and needs a CUDA device"
        if self.compile:
            return compile_unavailable_reason(device)
        return None

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        """Build a runner that casts outputs to the dtypes of eager's first recorded output."""
        if not graph.outputs:
            raise BackendError("Autocast needs eager's output of one sample to know its dtypes")
        first = graph.outputs[0]
        return AutocastRunner(
            self, module, device, _output_dtypes(first), _recorded_structure(flatten(first)[1])
        )

    def check_saved_runner(self, key: GraphKey, saved: Any, max_elements: int) -> None:
        """The record's output dtypes and structure, checked as untrusted input.

        The dtypes: a bounded list of known dtype names or None (an unhashable entry must be a
        typed error, not a ``TypeError``). The structure (records of this release): closed
        vocabulary naming no type of a module absent here, with one leaf per dtype. Needs no
        module (``tunetree info`` runs it too); :meth:`load` checks both against the module's
        output.
        """
        saved_output_structure(saved, saved_output_dtypes(saved))

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        """Rebuild the runner from the output dtypes in ``saved``, one per output leaf.

        The module's output structure is learnt on fake tensors shaped like ``key``
        (:func:`.flat.learn_output_spec`) and must match the saved one where the record has
        it: a record listing another number of outputs would make every call raise, so it
        is refused here (BackendError).
        """
        dtypes = saved_output_dtypes(saved)
        node = saved_output_structure(saved, dtypes)
        learnt = learn_output_spec(module, key, device)
        if node is not None:
            structure.build(node, lambda: learnt)
        if len(dtypes) != learnt.num_leaves:
            raise BackendError(
                f"the saved Autocast runner lists {len(dtypes)} output dtypes, but the module "
                f"returns {learnt.num_leaves} outputs on its graph: the record is damaged or "
                "altered"
            )
        return AutocastRunner(self, module, device, dtypes, _recorded_structure(learnt))


_DTYPE_NAMES = frozenset(
    dtype_name(dt)
    for dt in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
)
"""The dtype names an Autocast record may list (what :func:`_output_dtypes` writes)."""


def saved_output_dtypes(saved: Any) -> list[str | None]:
    """A saved record's ``output_dtypes``, checked as untrusted input (BackendError)."""
    dtypes = saved.get("output_dtypes") if isinstance(saved, dict) else None
    if not isinstance(dtypes, list):
        raise BackendError("the saved Autocast runner lacks its output dtypes; tune again")
    if len(dtypes) > MAX_SAVED_TENSORS:
        raise BackendError(f"the saved Autocast runner lists {len(dtypes)} output dtypes")
    for name in dtypes:
        if name is not None and not (isinstance(name, str) and name in _DTYPE_NAMES):
            raise BackendError(
                f"the saved Autocast runner lists an output dtype {str(name)[:40]!r}, not one "
                f"of {', '.join(sorted(_DTYPE_NAMES))} or null"
            )
    return dtypes


def saved_output_structure(saved: Any, dtypes: list[str | None]) -> list[Any] | None:
    """A saved record's output ``structure``, checked against its ``dtypes`` (BackendError).

    None for a record without one (written before the structure was recorded): its count
    is checked against the module's output only, by :meth:`Autocast.load`.
    """
    node = saved.get("structure") if isinstance(saved, dict) else None
    if node is None:
        return None
    checked = structure.check(node)
    structure.check_modules_present(checked)
    leaves = structure.leaf_count(checked)
    if leaves != len(dtypes):
        raise BackendError(
            f"the saved Autocast runner lists {len(dtypes)} output dtypes, but its output "
            f"structure has {leaves} leaves: the record is damaged or altered"
        )
    return checked
