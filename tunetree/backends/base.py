"""The backend protocol: a backend builds a runner for one graph of one module.

A backend is a small frozen dataclass whose fields are its configuration. It says
why it cannot run on a device (:meth:`Backend.unavailable_reason`) instead of
failing late, builds a :class:`Runner` for one graph, and loads a runner that a
previous :meth:`Runner.save` wrote.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..compare import Tolerances
from ..errors import BackendError
from ..graph import Graph, GraphKey


class Runner(ABC):
    """A built candidate: called like the module's forward for one graph."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @abstractmethod
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the graph; returns outputs with eager's structure and types."""

    def save(self, directory: Path) -> dict[str, Any]:
        """Write artifacts into ``directory`` (which exists and is empty) and return a small
        JSON-serialisable description that :meth:`Backend.load` takes back."""
        return {}


@dataclasses.dataclass(frozen=True)
class Backend(ABC):
    """Base of every backend. Subclasses are frozen dataclasses; their fields are the config."""

    kind: ClassVar[str] = "backend"
    """Stable identifier, stored in checkpoints and cache keys."""
    preserves_results: ClassVar[bool] = True
    """False for backends that change numbers (quantisation, bf16): never chosen by default."""
    extra: ClassVar[str | None] = None
    """The pip extra that installs this backend's package, named in error messages."""

    @property
    def name(self) -> str:
        """Readable name: the kind plus every option that differs from its default."""
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.default is not dataclasses.MISSING and getattr(self, f.name) != f.default
        ]
        return f"{self.kind}({', '.join(changed)})" if changed else self.kind

    def config(self) -> dict[str, Any]:
        """The configuration as JSON-serialisable data (``type(self)(**config)`` rebuilds it)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def tolerances(self) -> Tolerances | None:
        """Tolerances this backend is checked with, or None for the tune's tolerances."""
        return None

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why this backend cannot run on ``device`` here, or None when it can."""
        return None

    @abstractmethod
    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        """Build a runner for ``graph``. ``module`` runs its original forward; samples and
        the module are on ``device``. Raise anything on failure: the caller records it."""

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        description: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        """Rebuild a runner from what :meth:`Runner.save` wrote."""
        raise BackendError(f"backend {self.kind!r} cannot load saved runners")

    def __str__(self) -> str:
        return self.name

    def __deepcopy__(self, memo: dict[int, Any]) -> Backend:
        # Backends are immutable configurations: copying a strategy shares them.
        return self


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChangesResults(Backend):
    """Base of opt-in backends that change numbers (quantisation, reduced precision).

    Never in the default strategy; checked against eager with the looser tolerance
    ``atol + rtol * |eager|`` that the user sets here, and labelled in every table.
    """

    preserves_results: ClassVar[bool] = False
    atol: float = 5e-2
    rtol: float = 5e-2

    def tolerances(self) -> Tolerances:
        return Tolerances.uniform(self.atol, self.rtol)


def compile_unavailable_reason(device: torch.device, what: str = "compile=True") -> str | None:
    """Why ``torch.compile`` cannot run on ``device`` here (Inductor on CUDA needs triton)."""
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return f"{what} on CUDA needs triton (pip install triton)"
    return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def original_forward(module: nn.Module) -> Any:
    """The module's forward as its class defines it, bound to the module (never a tunetree
    dispatcher, so a runner that calls it cannot recurse into itself)."""
    return type(module).forward.__get__(module, type(module))
