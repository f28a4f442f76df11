"""A chain of slow linear stages and a fast, results-changing fake backend of known error."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch import nn

from tests.fakes import spin
from tunetree.backends.base import Backend, ChangesResults, Runner
from tunetree.signature.graph import Graph

MS = 1e-3


class Stage(nn.Module):
    """A bias-free linear layer that spins ``delay_s`` first: its eager latency is known.

    ``rel`` is the relative error :class:`Lossy` gives it; a scaled input passes through the
    next bias-free stages scaled, so errors compound as ``prod(1 + rel) - 1``.
    """

    def __init__(self, width: int, delay_s: float, rel: float) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width, bias=False)
        self.delay_s = delay_s
        self.rel = rel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spin(self.delay_s)
        return self.lin(x)


class Chain(nn.Module):
    def __init__(self, rels: list[float], width: int = 16, delay_s: float = 2 * MS) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stages = nn.ModuleList(Stage(width, delay_s, r) for r in rels)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


class _Run(Runner):
    def __init__(self, backend: Lossy, stage: Stage) -> None:
        super().__init__(backend)
        self.stage = stage
        self.lossy = backend

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stage.lin(x)
        if self.lossy.above is None or float(x.abs().max()) > self.lossy.above:
            out = out * (1 + self.stage.rel)
        return out


@dataclasses.dataclass(frozen=True)
class Lossy(ChangesResults):
    """Skips a stage's spin and scales its output by ``1 + stage.rel``: fast, known error.

    With ``above``, only inputs larger than it in magnitude are scaled (an error that the
    tuning inputs do not show and held-out inputs do).
    """

    kind: ClassVar[str] = "fake-lossy"
    above: float | None = None
    atol: float = 0.0
    rtol: float = 0.0

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        if not isinstance(module, Stage):
            raise RuntimeError("fake-lossy builds stages only")
        return _Run(self, module)

    def load(self, module: nn.Module, key: Any, directory: Any, saved: Any, device: Any) -> Runner:
        assert isinstance(module, Stage)
        return _Run(self, module)


class _ExactRun(Runner):
    def __init__(self, backend: Exact, stage: Stage) -> None:
        super().__init__(backend)
        self.stage = stage

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        spin(self.stage.delay_s / 4)
        return self.stage.lin(x)


@dataclasses.dataclass(frozen=True)
class Exact(Backend):
    """Spins a quarter of a stage's delay and keeps its results: a results-keeping fallback
    faster than eager and slower than :class:`Lossy`."""

    kind: ClassVar[str] = "fake-exact"
    builds: list = dataclasses.field(default_factory=list, compare=False, repr=False)

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        if not isinstance(module, Stage):
            raise RuntimeError("fake-exact builds stages only")
        self.builds.append(id(module))
        return _ExactRun(self, module)
