"""Quantisation with torchao: an opt-in candidate that changes results.

The module is deep-copied and the copy's ``nn.Linear`` weights are quantised with
``torchao.quantization.quantize_``; the user's module is never touched. Int8 weights
halve (vs bf16) or quarter (vs fp32) the bytes a memory-bound matmul reads; float8 uses
the tensor cores of GPUs with compute capability 8.9 or newer.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import BackendError, InvalidInputError
from ..signature.binding import original_forward
from ..signature.graph import Graph, GraphKey
from .base import ChangesResults, Runner
from .inductor import compile_unavailable_reason, fresh_entry
from .packages import install_hint, not_installed_reason

SCHEMES = ("int8-weight-only", "int8-dynamic", "float8-dynamic")
"""``int8-weight-only``: int8 weights, activations unchanged. ``int8-dynamic``: int8 weights
and per-call int8 activations. ``float8-dynamic``: float8 (e4m3) weights and activations."""


def _quantization_config(scheme: str) -> Any:
    """The torchao config object for ``scheme``.

    ``set_inductor_config=False`` because torchao would otherwise change Inductor's global
    settings for the whole process, and with them every other candidate's compile.
    """
    try:
        from torchao import quantization as q
    except Exception as exc:  # a torchao built for another torch can fail in many ways
        raise BackendError(
            f"torchao could not be imported ({type(exc).__name__}: {exc}); install a torchao "
            f"that matches this PyTorch: {install_hint(TorchAO)}"
        ) from exc
    names = {
        "int8-weight-only": "Int8WeightOnlyConfig",
        "int8-dynamic": "Int8DynamicActivationInt8WeightConfig",
        "float8-dynamic": "Float8DynamicActivationFloat8WeightConfig",
    }
    cls = getattr(q, names[scheme], None)
    if cls is None:
        raise BackendError(
            f"this torchao has no torchao.quantization.{names[scheme]}; "
            f"upgrade it: {install_hint(TorchAO, upgrade=True)}"
        )
    try:
        return cls(set_inductor_config=False)
    except TypeError:  # older torchao without the option
        return cls()


def quantized_copy(module: nn.Module, scheme: str) -> nn.Module:
    """A deep copy of ``module`` with its linear layers quantised by torchao."""
    config = _quantization_config(scheme)
    from torchao.quantization import quantize_

    quantized = copy.deepcopy(module)
    with torch.no_grad():
        quantize_(quantized, config)
    return quantized


class TorchAORunner(Runner):
    """Runs the original forward of a quantised deep copy of the module.

    Optionally ``torch.compile``-d. The copy is made at build time: later in-place changes to
    the user's weights are not seen by this runner.
    """

    def __init__(self, backend: TorchAO, module: nn.Module) -> None:
        super().__init__(backend)
        self.module = quantized_copy(module, backend.scheme)
        forward: Callable[..., Any] = original_forward(self.module)
        self.forward = (
            torch.compile(fresh_entry(forward), dynamic=False) if backend.compile else forward
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the forward of the quantised copy."""
        return self.forward(*args, **kwargs)

    def save(self, directory: Path) -> dict[str, Any]:
        """Record torchao's version only: load quantises the module again."""
        # Quantised weights would need pickled tensor subclasses to store, and loading a
        # checkpoint must never unpickle arbitrary objects: load quantises the module again.
        import torchao

        return {"torchao_version": str(getattr(torchao, "__version__", "unknown"))}


@dataclasses.dataclass(frozen=True)
class TorchAO(ChangesResults):
    """torchao quantisation of the module's linear layers (on a copy; changes results).

    Loading a saved runner quantises the module again (deterministic for these schemes).

    Args:
        scheme: One of :data:`SCHEMES`.
        compile: Also ``torch.compile`` the quantised forward (torchao's fast kernels often
            need it).
        atol: Absolute tolerance against eager (keyword-only).
        rtol: Relative tolerance against eager (keyword-only).

    Raises:
        InvalidInputError: An unknown scheme.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.TorchAO("int8-dynamic").extra
        'ao'
    """

    kind: ClassVar[str] = "torchao"
    typical_build_s: ClassVar[float | None] = 1.0  # quantizes the weights (compile: 12 s)
    extra: ClassVar[str | None] = "ao"
    libraries: ClassVar[tuple[str, ...]] = ("torchao",)
    scheme: str = "int8-weight-only"
    compile: bool = False

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise InvalidInputError(
                f"TorchAO scheme must be one of {', '.join(SCHEMES)}, not {self.scheme!r}"
            )

    def build_prior_s(self) -> float | None:
        """Quantizing the weights takes about a second; with ``compile``, Inductor's compile."""
        return 12.0 if self.compile else self.typical_build_s

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why torchao cannot run this scheme on ``device``, or None."""
        missing = not_installed_reason(self, "torchao")
        if missing is not None:
            return missing
        if device.type == "cuda" and not torch.cuda.is_available():
            return "CUDA is not available here (torch.cuda.is_available() is False)"
        if self.scheme == "float8-dynamic":
            if device.type != "cuda":
                return (
                    "scheme 'float8-dynamic' needs a CUDA GPU with compute capability 8.9 or "
                    f"newer; use an int8 scheme on {device.type}"
                )
            capability = torch.cuda.get_device_capability(device)
            if capability < (8, 9):
                return (
                    "scheme 'float8-dynamic' needs compute capability 8.9 or newer (Ada, "
                    f"Hopper); this GPU has {capability[0]}.{capability[1]}"
                )
        if self.compile:
            return compile_unavailable_reason(device)
        return None

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        """Return a runner over a quantised copy of ``module``."""
        return TorchAORunner(self, module)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        """Quantise a copy of ``module`` again (nothing is read from disk)."""
        return TorchAORunner(self, module)
