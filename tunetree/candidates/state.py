"""What one graph's session holds: the module, the graph, the settings and the budget.

:class:`SessionState` is the data the session's parts read (:mod:`.checking`,
:mod:`.building`, :mod:`.measuring`); :class:`~.evaluate.GraphSession` puts them together.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch import nn

from .._util.progress import Progress
from ..accuracy import AccuracyBudget
from ..backends.base import Backend
from ..signature.compare import Tolerances
from ..signature.graph import Graph
from .budget import Deadline, Stopwatch
from .measure import MeasureConfig


@dataclass
class SessionState:
    """One graph of one module, the settings to evaluate its candidates, and the counts so far."""

    module: nn.Module
    path: str
    graph: Graph
    device: torch.device
    tolerances: Tolerances = field(default_factory=Tolerances)
    measure_config: MeasureConfig = field(default_factory=MeasureConfig)
    progress: Progress = field(default_factory=lambda: Progress(False))
    on_build: Callable[[Backend], None] | None = None
    """Called before every backend build (the cache and tests count builds with it)."""
    measure_lock: Callable[[], AbstractContextManager[None]] | None = None
    """Held around every measurement when set: the tuning cache supplies its device lock on
    a miss so concurrent tuners do not disturb each other's timings. Sessions derived from
    this one (``dataclasses.replace``) keep it."""
    deadline: Deadline | None = None
    """When set, a candidate (other than eager) whose build is not expected to end before it is
    skipped without a build, measurements stop at it, and one with no time left is skipped."""
    clock: Stopwatch = field(default_factory=Stopwatch, repr=False)
    """Where builds, checks and measurements charge their time (the result's breakdown)."""
    usable_built: int = field(default=0, repr=False)
    """Candidates built and checked correct so far (what a measurement would time)."""
    usable_others: int = field(default=0, repr=False)
    """Of those, the ones other than eager: until one is, a build may use more than its
    graph's share of the budget (see :meth:`Deadline.room_to_build`)."""
    call_s: float = 0.0
    """About one eager call of this graph (from the inspection): how long measurements take."""
    accuracy: AccuracyBudget | None = None
    """When set, results-changing candidates are admitted by their error in the budget's module
    metric (at most :attr:`AccuracyBudget.module_limit`) instead of their tolerances, and every
    row records its error."""

    def _least(self, config: MeasureConfig, candidates: int) -> float:
        """About the shortest measurement of ``candidates`` of this graph with ``config``."""
        return config.least_s(candidates, self.call_s, len(self.graph.samples))
