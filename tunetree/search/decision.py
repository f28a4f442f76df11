"""Reuse the depth decision an earlier auto_tune recorded, checked again on this host.

A fresh host of a fleet finds every graph in the shared cache, yet measuring the untuned model
and each depth end to end to choose the depth again took most of its time. The first host's
choice is recorded in the tuning cache (:mod:`tunetree.cache.decisions`, keyed by the model's
structure, the dataset's signatures, the strategy, tolerances, depths, tie tolerance, the
hard environment and torch's thread count). With the same key,
:meth:`DepthDecisions.try_reuse`:

1. tunes only the recorded depth's cut, through a cache view that stops at the first miss:
   nothing is built; every graph must be a cache hit (its winner loaded from its artifacts
   and checked against eager on this host's samples, as always);
2. requires the winners to form the recorded plan exactly (same graphs, same backends and
   configs): a plan that would differ is not the one measured there;
3. checks the plan's outputs against eager end to end, once;
4. measures it once side by side with the untuned model, so the speed-up reported is this
   host's own; it must beat the untuned model by more than the tie tolerance.

Any step that fails leaves the model as it was and the full search runs (what the attempt
loaded is reused through the run's memo). Only a recorded selection is reused: a decision to
leave the model untuned is not (the full search runs, since one more look costs what it
costs on the first host and a depth that wins here should be found), nor a decision under an
accuracy budget (its plan is often a repaired one that no cache winner reproduces, and its
check needs the budget's held-out inputs and task score: the search runs in full). The other
depths show as not measured, with the reason.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

from .._util.progress import Progress
from ..cache import TuningCache
from ..cache.decisions import (
    DecisionIdentity,
    DecisionStore,
    DepthDecision,
    DepthOutcome,
    decision_identity,
    planned_graphs,
    same_plan,
)
from ..candidates.budget import END_TO_END, END_TO_END_CHECK, Deadline, Stopwatch
from ..candidates.evaluate import GraphSession
from ..candidates.measure import MeasureConfig, Timing
from ..candidates.results import GraphCache, GraphResult
from ..candidates.strategy import Strategy
from ..runtime.plan import Plan
from ..runtime.wrap import wrap
from ..signature.compare import Tolerances
from ..signature.inspection import ModelInfo
from ..signature.modules import CallFn
from .accuracy_check import EndToEndCheck
from .auto_result import AutoTuneResult, DepthRow, DepthStatus
from .endtoend import UNTUNED, load_text, output_problem, too_noisy
from .tune import GraphMemo, plan_from

log = logging.getLogger(__name__)

ELSEWHERE = "depth chosen on a host of the same kind"
REUSED = "reused"
"""The name the recorded plan is measured under, beside the untuned model."""


class TuningRun(Protocol):
    """What the reuse needs of one auto_tune call (``search.depths.DepthRun``)."""

    model: Any
    info: ModelInfo
    call: CallFn | None
    config: MeasureConfig
    strategy: Strategy
    tolerances: Tolerances | None
    progress: Progress
    cache: GraphCache | None
    deadline: Deadline | None
    clock: Stopwatch
    accuracy: EndToEndCheck | None
    generation: bool
    memo: GraphMemo
    plans: dict[int, Plan]
    graphs: dict[int, list[GraphResult]]

    def measure(self, models: dict[str, Any]) -> dict[str, Timing]:
        """End-to-end latency of each model, interleaved in one measurement."""

    def tune_cut(self, depth: int, cache: GraphCache | None) -> list[GraphResult]:
        """The cut at ``depth`` tuned with the run's settings, through ``cache``."""

    def restore(self) -> None:
        """Unwrap the model and put back every tensor a backend moved."""


class _Missed(Exception):
    """A graph of the recorded depth is not in the cache: the reuse stops before any build."""


class _HitsOnly:
    """The run's cache as the reuse asks it: a hit is served, a miss stops the reuse."""

    def __init__(self, cache: GraphCache) -> None:
        self.cache = cache

    def lookup(self, session: GraphSession, strategy: Strategy) -> GraphResult | None:
        result = self.cache.lookup(session, strategy)
        if result is None:
            close = getattr(self.cache, "close", None)
            if close is not None:
                close()  # the writer lock a miss takes: the full search takes it again
            raise _Missed(f"{session.path or '<model>'} {session.graph} is not in the cache")
        return result

    def store(self, session: GraphSession, strategy: Strategy, result: GraphResult) -> None:
        self.cache.store(session, strategy, result)


@dataclass
class DepthDecisions:
    """The recorded decision of one auto_tune call: reused when it holds here, else recorded."""

    run: TuningRun
    rows: list[DepthRow]
    tie_tolerance: float
    reuse: bool
    store: DecisionStore | None = None
    ident: DecisionIdentity | None = None
    reused: DepthDecision | None = None

    @classmethod
    def open(
        cls, run: TuningRun, rows: list[DepthRow], tie_tolerance: float, reuse: bool
    ) -> DepthDecisions:
        """The decisions of ``run``: none without a :class:`TuningCache` or under a budget."""
        found = cls(run, rows, tie_tolerance, reuse)
        if not isinstance(run.cache, TuningCache) or run.accuracy is not None:
            return found
        try:
            found.ident = decision_identity(
                run.model,
                run.info,
                strategy=run.strategy,
                tolerances=run.tolerances,
                accuracy=None,
                depths=[r.depth for r in rows],
                tie_tolerance=tie_tolerance,
                measure_config=run.config,
                call=run.call,
            )
        except Exception as exc:  # a model the key cannot describe: search, record nothing
            log.info("auto_tune: no depth decision for this model (%s)", exc)
            return found
        found.store = run.cache.decisions
        return found

    # ------------------------------------------------------------------ reuse

    def try_reuse(self) -> Timing | None:
        """Apply the recorded decision; the untuned model's timing when it held, else None.

        When it held, the rows say so and the run holds the depth's plan and graphs (for
        ``_finish`` to select); else nothing of the run or the model changed.
        """
        if not self.reuse or self.store is None or self.ident is None:
            return None
        decision = self.store.get(self.ident)
        if decision is None:
            return None
        if decision.selected is None:
            log.info("auto_tune: the recorded decision left the model untuned: searching again")
            return None
        outcome = decision.outcome(decision.selected)
        row = next((r for r in self.rows if r.depth == decision.selected), None)
        if outcome is None or row is None:
            return None
        self.run.progress(
            f"depth {row.depth}", f"{ELSEWHERE}: checking its plan here (no other depth measured)"
        )
        try:
            untuned = self._apply(row, outcome)
        except Exception as exc:  # a runner that breaks here: the full search decides
            log.warning("auto_tune: the recorded depth %d failed here (%s)", row.depth, exc)
            untuned = None
        finally:
            self.run.restore()
        if untuned is None:
            self.run.progress(f"depth {row.depth}", "recorded decision not reused: full search")
            return None
        self.reused = decision
        for other in self.rows:
            if other is not row:
                there = decision.outcome(other.depth)
                other.status = DepthStatus.NOT_MEASURED
                other.error = ELSEWHERE + _there(there)
        return untuned

    def _apply(self, row: DepthRow, outcome: DepthOutcome) -> Timing | None:
        """Steps 1-4 of the module docstring; None (with the reason logged) when one fails."""
        run = self.run
        assert run.cache is not None
        try:
            results = run.tune_cut(row.depth, _HitsOnly(run.cache))
        except _Missed as missed:
            return _refused(row, str(missed))
        run.restore()  # weights a backend moved while loading
        plan = plan_from(results, row.depth)
        if not plan.runners() or not same_plan(outcome.plan, plan):
            return _refused(row, "the cache's winners no longer make the recorded plan")
        tuned = wrap(run.model, plan.runners(), in_place=False)
        with run.clock.phase(END_TO_END_CHECK):
            problem = output_problem(run.info, run.call, tuned, plan, run.tolerances)
        if problem:
            return _refused(row, f"end-to-end output: {problem}")
        run.progress(f"depth {row.depth}", "measuring end to end beside the untuned model")
        with run.clock.phase(END_TO_END, f"depth {row.depth}"):
            timings = run.measure({UNTUNED: run.model, REUSED: tuned})
        speedup = timings[UNTUNED].median_s / timings[REUSED].median_s
        if speedup <= 1.0 + self.tie_tolerance:
            return _refused(
                row, f"{speedup:.3f}x here, not faster than untuned by {self.tie_tolerance:g}"
            )
        row.status, row.timing, row.untuned = DepthStatus.REUSED, timings[REUSED], timings[UNTUNED]
        row.speedup, row.error = speedup, _there(outcome).strip(" ()")
        if too_noisy(timings):
            row.noisy = True
            log.warning("depth %d: end-to-end timings too spread (%s)", row.depth, load_text())
        run.plans[row.depth], run.graphs[row.depth] = plan, results
        return timings[UNTUNED]

    # ------------------------------------------------------------------ record

    def note(self) -> str:
        """How the depth was chosen when a recorded decision was reused ("" after a search)."""
        if self.reused is None:
            return ""
        there = self.reused.outcome(self.reused.selected)
        return (
            f"depth {self.reused.selected} was {ELSEWHERE}{_there(there)} and re-checked "
            "here (outputs against eager, one measurement beside the untuned model); the "
            "other depths were not measured (auto_tune(..., reuse_decision=False) measures "
            "them all)"
        )

    def record(self, result: AutoTuneResult) -> None:
        """Record the full search's decision in the tuning cache.

        Not recorded after a reused decision, when the time budget skipped work or a depth
        failed (the choice was not made among every depth), nor without a tuning cache or under
        an accuracy budget.
        """
        if self.reused is not None:
            return
        if self.store is None or self.ident is None or result.skipped():
            return
        if any(r.status is DepthStatus.FAILED for r in self.rows):
            return
        outcomes = [
            DepthOutcome(
                r.depth,
                r.status.value,
                r.speedup if r.speedup is not None and math.isfinite(r.speedup) else None,
                planned_graphs(self.run.plans[r.depth]) if r.depth in self.run.plans else [],
            )
            for r in self.rows
        ]
        decision = DepthDecision(
            self.ident.key,
            result.depth,
            outcomes,
            self.ident.hard,
            self.ident.model,
            time.time(),
        )
        self.store.put(decision)


def _refused(row: DepthRow, reason: str) -> Timing | None:
    """Log why the recorded decision is not reused; None, for the caller to return."""
    log.info("auto_tune: recorded decision for depth %d not reused: %s", row.depth, reason)
    return None


def _there(outcome: DepthOutcome | None) -> str:
    """`` (2.47x there)`` or `` (there: rejected)``: what the recorded search found."""
    if outcome is None:
        return ""
    if outcome.speedup is not None:
        return f" ({outcome.speedup:.2f}x there)"
    return f" (there: {outcome.status})"
