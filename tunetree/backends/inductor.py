"""torch.compile with the Inductor backend."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import InvalidInputError
from ..graph import Graph, GraphKey, detach_clone
from .base import Backend, Runner, original_forward
from .packages import install_hint, missing_packages


def fresh_entry(forward: Any) -> Any:
    """A function calling ``forward`` that has a code object of its own.

    Dynamo keeps its compiled-graph cache on the code object it compiles. ``torch.compile``
    of a ``torch.nn`` forward goes through one shared wrapper, so after eight modules the
    recompile limit is hit and later ones silently run eager. Compiling a fresh entry
    function per runner gives each runner its own cache.
    """

    def entry(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    entry.__code__ = entry.__code__.replace()
    return entry


def compile_unavailable_reason(device: torch.device, what: str = "compile=True") -> str | None:
    """Why ``torch.compile`` cannot run on ``device`` here (Inductor on CUDA needs triton)."""
    if device.type == "cuda" and missing_packages("triton"):
        return f"{what} on CUDA needs triton ({install_hint(Inductor)})"
    return None


class InductorRunner(Runner):
    """A ``torch.compile``-d original forward. Compilation happens on the first call; a runner
    loaded from a checkpoint therefore recompiles from the module (Inductor's own on-disk
    cache makes that fast on the machine that tuned it)."""

    def __init__(self, backend: Inductor, module: nn.Module) -> None:
        super().__init__(backend)
        self.compiled = torch.compile(
            fresh_entry(original_forward(module)),
            mode=backend.mode,
            dynamic=backend.dynamic,
            fullgraph=backend.fullgraph,
            options=dict(backend.options) or None,
        )
        # Modes that replay CUDA graphs hand back outputs that the next replay overwrites.
        self.clone_outputs = backend.mode in ("reduce-overhead", "max-autotune")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.compiled(*args, **kwargs)
        return detach_clone(out) if self.clone_outputs else out


@dataclasses.dataclass(frozen=True)
class Inductor(Backend):
    """``torch.compile(backend="inductor")``.

    ``mode`` is one of None, ``"reduce-overhead"``, ``"max-autotune"``,
    ``"max-autotune-no-cudagraphs"``; ``options`` are Inductor config entries
    (given as a tuple of ``(name, value)`` pairs or a dict).
    """

    kind: ClassVar[str] = "inductor"
    libraries: ClassVar[tuple[str, ...]] = ("triton",)
    mode: str | None = None
    dynamic: bool | None = False
    fullgraph: bool = False
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.mode is not None and self.options:
            raise InvalidInputError(
                "torch.compile takes either mode or options, not both: put the mode's settings "
                "into options (e.g. {'max_autotune': True}) or drop the options"
            )
        if isinstance(self.options, dict):
            object.__setattr__(self, "options", tuple(sorted(self.options.items())))
        elif isinstance(self.options, list):
            object.__setattr__(self, "options", tuple(tuple(o) for o in self.options))

    def unavailable_reason(self, device: torch.device) -> str | None:
        reason = compile_unavailable_reason(device, "Inductor")
        if reason:
            return reason
        if self.mode in ("reduce-overhead",) and device.type == "cpu":
            return "mode='reduce-overhead' uses CUDA graphs and needs a CUDA device"
        return None

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        return InductorRunner(self, module)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        return InductorRunner(self, module)
