"""Eager PyTorch: the module's own forward. The baseline every candidate is compared with."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..signature.binding import original_forward
from ..signature.graph import Graph, GraphKey
from .base import Backend, Runner


class EagerRunner(Runner):
    """Calls the module's original forward."""

    def __init__(self, backend: Backend, module: nn.Module) -> None:
        super().__init__(backend)
        self.forward = original_forward(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the module's original forward."""
        return self.forward(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Eager(Backend):
    """Run the module unchanged. When eager wins, tunetree leaves the module unwrapped.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.Eager().kind
        'eager'
    """

    kind: ClassVar[str] = "eager"
    typical_build_s: ClassVar[float | None] = 0.0  # no build: the module's own forward

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        """Return a runner that calls the module's original forward."""
        return EagerRunner(self, module)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        """Return a runner that calls the module's original forward (nothing was saved)."""
        return EagerRunner(self, module)
