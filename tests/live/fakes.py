"""A model whose own forward is slow and a backend that skips the wait: tt.jit's test fixtures."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

import tunetree as tt
from tests.fakes import spin
from tunetree.backends.base import Backend, Runner
from tunetree.signature.graph import Graph, GraphKey

BUILDS: list[str] = []
RUNS: list[int] = []
"""One entry per call a :class:`FastRunner` served: the serving thread's ident.

Another test's tuner thread may still be measuring a runner of its own when a test counts,
so tests count only the calls their own thread made (:func:`runs_here`).
"""


def runs_here() -> int:
    """Calls a :class:`FastRunner` served on the calling thread."""
    me = threading.get_ident()
    return sum(1 for ident in RUNS if ident == me)


class Slow(nn.Module):
    """``tanh(lin(x))`` after a busy wait of ``delay_s`` (what a runner saves)."""

    def __init__(self, delay_s: float = 0.004) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.delay_s = delay_s

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spin(self.delay_s)
        return self.compute(x)


def model(seed: int = 0) -> Slow:
    torch.manual_seed(seed)
    return Slow().eval()


def calls(rows: list[int]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(r, 8, generator=g) for r in rows]


class FastRunner(Runner):
    def __init__(self, backend: Backend, module: Slow) -> None:
        super().__init__(backend)
        self.module = module

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        RUNS.append(threading.get_ident())
        return self.module.compute(x)

    def save(self, directory: Path) -> dict[str, Any]:
        (directory / "note.txt").write_text("fast\n")
        return {"note": "note.txt"}


@dataclasses.dataclass(frozen=True)
class Fast(Backend):
    """Serves :class:`Slow` without its wait; refuses other modules."""

    kind: ClassVar[str] = "test-live-fast"

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        if not isinstance(module, Slow):
            raise tt.BackendError("only Slow")
        BUILDS.append(type(module).__name__)
        return FastRunner(self, module)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        assert isinstance(module, Slow)
        assert (directory / saved["note"]).read_text() == "fast\n"
        return FastRunner(self, module)


def options() -> dict[str, Any]:
    """The auto_tune options every test process passes (a warm start needs the same)."""
    return {
        "strategy": tt.MinLatencyStrategy([Fast(), tt.backends.Eager()]),
        "measure_config": tt.MeasureConfig.quick(),
        "max_depth": 0,
    }


@dataclasses.dataclass(frozen=True)
class Glacial(Fast):
    """:class:`Fast` with a build expected to take days: a time budget never starts it."""

    kind: ClassVar[str] = "test-live-glacial"
    typical_build_s: ClassVar[float | None] = 1e6

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        BUILDS.append("Glacial")
        return super().build(module, graph, device)


def budget_cut_options() -> dict[str, Any]:
    """:func:`options` with a candidate the time budget skips: every race is cut short."""
    return {
        "strategy": tt.MinLatencyStrategy([Fast(), Glacial(), tt.backends.Eager()]),
        "measure_config": tt.MeasureConfig.quick(),
        "max_depth": 0,
        "time_budget": 120.0,
    }
