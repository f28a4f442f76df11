"""The best whole-model single backend as a rival in auto_tune's final selection.

Depths are measured one at a time, each beside the untuned model, and compared by their
speed-ups: two depths' latencies never come from the same measurement, so a load change or a
runtime's threads between the two runs can rank them wrongly (docs/measurements.md has a
case). When depth 0 ran
each backend on the whole model, the best of them is therefore timed once more side by side
with the selected plan and the untuned model, through the user's ``call``, and the faster is
kept (the whole-model backend within the tie tolerance: it is the shallower, simpler plan).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._util.table import format_seconds
from ..candidates.measure import Timing
from ..candidates.results import GraphResult
from ..runtime.plan import Plan, PlanEntry
from .endtoend import UNTUNED

SELECTED = "selected"
WHOLE_MODEL = "whole model"


def whole_model_plan(results: list[GraphResult], depth: int = 0) -> Plan | None:
    """The single backend that serves every graph of the cut fastest, as a plan.

    Per backend kind other than eager, each graph takes that kind's fastest usable measured
    row (eager's where the kind has none); kinds are ranked by the sum of those latencies,
    each weighted by the graph's number of recorded calls (its share of the workload). None
    when no kind has a usable row.
    """
    best = [g.best_per_kind() for g in results]
    kinds = sorted({kind for rows in best for kind in rows} - {"eager"})
    if not results or not kinds:
        return None

    def total(kind: str) -> float:
        cost = 0.0
        for graph, rows in zip(results, best, strict=True):
            row = rows.get(kind) or rows.get("eager")
            if row is None or row.latency_s is None:
                return float("inf")
            cost += max(1, len(graph.graph.samples)) * row.latency_s
        return cost

    kind = min(kinds, key=total)
    if total(kind) == float("inf"):
        return None
    entries = []
    for graph, rows in zip(results, best, strict=True):
        row = rows.get(kind) or rows["eager"]
        assert row.runner is not None  # best_per_kind keeps usable rows only
        entries.append(
            PlanEntry(
                graph.path,
                graph.graph.key,
                row.backend,
                row.runner,
                row.latency_s,
                graph.eager_latency_s,
            )
        )
    return Plan(entries, depth)


def backend_of(plan: Plan) -> str:
    """The backend kind a whole-model plan uses (``eager`` when it uses none other)."""
    kinds = sorted({e.backend.kind for e in plan.entries if e.backend.kind != "eager"})
    return ", ".join(kinds) or "eager"


@dataclass
class FinalCheck:
    """The final side by side: the selected depth's plan, the whole-model rival, untuned."""

    selected: int | None
    """The depth selected before the check (None: the untuned model)."""
    rival: str
    """The rival's backend kind."""
    timings: dict[str, Timing]
    kept_rival: bool
    note: str = ""
    """Why the check did not run (then ``timings`` is empty)."""

    def __str__(self) -> str:
        if self.note:
            return f"final side by side with the whole-model {self.rival}: {self.note}"
        parts = []
        if SELECTED in self.timings:
            parts.append(f"depth {self.selected} {_ms(self.timings[SELECTED])}")
        parts.append(f"whole-model {self.rival} (depth 0) {_ms(self.timings[WHOLE_MODEL])}")
        parts.append(f"untuned {_ms(self.timings[UNTUNED])}")
        if self.kept_rival:
            kept = f"kept the whole-model {self.rival}"
        elif self.selected is None:
            kept = "kept the untuned model"
        else:
            kept = f"kept depth {self.selected}"
        return f"final side by side: {', '.join(parts)}: {kept}"


def _ms(timing: Timing) -> str:
    return format_seconds(timing.median_s)


def decide(
    timings: dict[str, Timing], tie_tolerance: float, fastest_untuned_s: float | None = None
) -> bool:
    """Whether the whole-model rival is kept.

    It must beat the untuned model, and be no slower than the selected plan (if any) by more
    than ``tie_tolerance``. The untuned model's time is the fastest of the run
    (``fastest_untuned_s``, from the earlier measurements, and this one): beside another
    runtime it runs slower, which would keep a rival slower than the untuned model
    (docs/measurements.md).
    """
    rival = timings[WHOLE_MODEL].median_s
    untuned = timings[UNTUNED].median_s
    if fastest_untuned_s is not None:
        untuned = min(untuned, fastest_untuned_s)
    if rival >= untuned:
        return False
    selected = timings.get(SELECTED)
    return selected is None or rival <= selected.median_s * (1 + tie_tolerance)


@dataclass
class FinalRun:
    """What the final check needs of an auto-tune run (given by :mod:`.auto`)."""

    untuned: Any
    """The untuned model, measured beside the plans."""
    wrap_plan: Callable[[Plan], Any]
    """A plan's tuned model, leaving the untuned one untouched."""
    problems: Callable[[Any, Plan], str]
    """Why a tuned model's outputs differ from eager's ("" when they match)."""
    measure: Callable[[dict[str, Any]], dict[str, Timing]]
    """End-to-end timings of models measured side by side, through the user's call."""
    restore: Callable[[], None]
    """Undo every wrap afterwards."""
    room: Callable[[], bool]
    """Whether the time budget has room for one more end-to-end measurement."""


def final_check(
    run: FinalRun,
    plans: dict[int, Plan],
    selected: int | None,
    rival: Plan,
    tie_tolerance: float,
    fastest_untuned_s: float | None = None,
) -> FinalCheck | None:
    """Time the selected plan, the whole-model rival and the untuned model side by side.

    ``fastest_untuned_s``: the untuned model's fastest time in the run so far (see
    :func:`decide`). None when there is nothing to compare: the rival is the selected plan,
    or the untuned model is selected and the rival was measured beside it already. A rival
    whose outputs differ from eager's end to end is never timed.
    """
    kind = backend_of(rival)
    signature = rival.signature()
    current = plans.get(selected) if selected is not None else None
    if current is not None and current.signature() == signature:
        return None
    if current is None and any(p.signature() == signature for p in plans.values()):
        return None
    if not run.room():
        return FinalCheck(selected, kind, {}, False, "not run: time budget used up")
    try:
        models = {WHOLE_MODEL: run.wrap_plan(rival)}
        problem = run.problems(models[WHOLE_MODEL], rival)
        if problem:
            return FinalCheck(selected, kind, {}, False, f"not timed: end-to-end output: {problem}")
        if current is not None:
            models[SELECTED] = run.wrap_plan(current)
        timings = run.measure({UNTUNED: run.untuned, **models})
    except Exception as exc:  # the depths' own measurements stand
        return FinalCheck(selected, kind, {}, False, f"failed: {type(exc).__name__}: {exc}")
    finally:
        run.restore()
    return FinalCheck(selected, kind, timings, decide(timings, tie_tolerance, fastest_untuned_s))
