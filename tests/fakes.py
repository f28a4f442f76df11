"""Test-only backends and models with known behaviour and latency (no real compiles)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar

import torch
from torch import nn

import tunetree as tt
from tests.clock import VirtualClock
from tunetree.backends.base import Backend, Runner
from tunetree.signature.binding import original_forward
from tunetree.signature.graph import Graph


def spin(seconds: float) -> None:
    """Busy-wait: steadier than sleep for sub-millisecond delays.

    Under the ``virtual_time`` fixture it advances the virtual clock instead (``tests/clock.py``).
    """
    clock = time.perf_counter
    if isinstance(clock, VirtualClock):
        clock.advance(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _FnRunner(Runner):
    def __init__(self, backend: Backend, fn: Any) -> None:
        super().__init__(backend)
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Delayed(Backend):
    """Runs the original forward plus a fixed busy-wait: a candidate of known latency."""

    kind: ClassVar[str] = "fake-delayed"
    delay_s: float = 0.0
    label: str = ""
    builds: list = dataclasses.field(default_factory=list, compare=False, repr=False)

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        self.builds.append(type(module).__name__)
        forward = original_forward(module)

        def run(*args: Any, **kwargs: Any) -> Any:
            spin(self.delay_s)
            return forward(*args, **kwargs)

        return _FnRunner(self, run)


@dataclasses.dataclass(frozen=True)
class Failing(Backend):
    """Raises while building (stage="build") or while running (stage="run")."""

    kind: ClassVar[str] = "fake-failing"
    stage: str = "build"

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        if self.stage == "build":
            raise RuntimeError("backend exploded while building")

        def run(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("backend exploded while running")

        return _FnRunner(self, run)


@dataclasses.dataclass(frozen=True)
class Wrong(Backend):
    """Returns eager's output plus ``offset``: must be rejected by the comparison."""

    kind: ClassVar[str] = "fake-wrong"
    offset: float = 0.1

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        forward = original_forward(module)
        return _FnRunner(self, lambda *a, **k: forward(*a, **k) + self.offset)


class Busy(nn.Module):
    """Spins ``delay_s`` of its own, then runs its children in order and a small linear.

    ``fast(x)`` computes the same output without any spinning; the :class:`Shortcut`
    backend runs ``fast`` plus ``tuned_delay_s``: so every cut's tuned latency is known.
    """

    def __init__(
        self,
        delay_s: float,
        tuned_delay_s: float,
        children: list[nn.Module] | None = None,
        broken: bool = False,
    ) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.tuned_delay_s = tuned_delay_s
        self.broken = broken
        self.kids = nn.ModuleList(children or [])
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spin(self.delay_s)
        for kid in self.kids:
            x = kid(x)
        return torch.tanh(x)

    def fast(self, x: torch.Tensor) -> torch.Tensor:
        for kid in self.kids:
            x = kid.fast(x)
        return torch.tanh(x)


@dataclasses.dataclass(frozen=True)
class Shortcut(Backend):
    """Runs :meth:`Busy.fast` plus the module's ``tuned_delay_s``; fails on broken modules."""

    kind: ClassVar[str] = "fake-shortcut"
    builds: list = dataclasses.field(default_factory=list, compare=False, repr=False)
    moves_weights: bool = False

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        self.builds.append(id(module))
        if getattr(module, "broken", False):
            raise RuntimeError("cannot convert a broken module")
        if self.moves_weights:
            for p in module.parameters():
                p.data = p.data.to(torch.float64)
        assert isinstance(module, Busy)

        def run(x: torch.Tensor) -> torch.Tensor:
            spin(module.tuned_delay_s)
            return module.fast(x)

        return _FnRunner(self, run)


def mlp(width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)).eval()


def quick_tune(
    model: Any, data: list[Any], backends: list[Backend], depth: int = 0, **kw: Any
) -> tt.TuneResult:
    """``tt.tune`` with quick measurements, no progress output and the fastest backend winning."""
    strategy = tt.HighestThroughputStrategy(backends)
    return tt.tune(
        model,
        data,
        depth=depth,
        strategy=strategy,
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        **kw,
    )
