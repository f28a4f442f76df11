"""Fit a plan into an accuracy budget: check it end to end, give precision back where it costs.

A plan whose end-to-end check fails is repaired one graph at a time: the results-changing
graph with the largest measured error on its own outputs (its *impact*) returns to its best
results-keeping candidate, or to its forward, and the plan is checked again. Each plan checked
is a :class:`PlanStep`, so a report can show the whole path. The check itself (tuning inputs,
held-out inputs, a task metric) is the caller's: this module only walks the repair order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..runtime.plan import Plan, PlanEntry
from ..signature.graph import GraphKey

GraphId = tuple[str, GraphKey]
"""A graph of a plan: its module path and its key."""


@dataclass(frozen=True)
class Verdict:
    """A plan's end-to-end check against a budget."""

    within: bool
    error: float | None = None
    """Worst error over the tuning inputs (None: not measured, e.g. a build failed)."""
    heldout_error: float | None = None
    """Worst error over the held-out inputs (None: not checked, or none held out)."""
    score_drop: float | None = None
    """How much the task metric fell (None: no ``evaluate``, or not reached)."""
    reason: str = ""
    """Why the plan is outside the budget ("" when within)."""
    heldout_only: bool = False
    """The plan held the budget on the tuning inputs and broke it on the held-out ones."""


@dataclass
class PlanStep:
    """One plan checked against the budget at one depth."""

    depth: int
    label: str
    plan: Plan
    verdict: Verdict
    latency_s: float | None = None
    """End-to-end median latency, when this plan was measured."""
    speedup: float | None = None
    chosen: bool = False


def repair(
    depth: int,
    name: str,
    plan: Plan,
    impact: Mapping[GraphId, float],
    fallback: Mapping[GraphId, PlanEntry | None],
    check: Callable[[Plan], Verdict],
    first: Verdict | None = None,
) -> list[PlanStep]:
    """Check ``plan``, then give its graphs back in order of impact until one plan is within.

    ``impact`` holds the results-changing graphs of the plan with their measured impact (larger
    goes back first); ``fallback`` what each returns to (None: the module's forward); ``first``
    the plan's own verdict when already checked. Returns every step, the last one within the
    budget when any is.
    """
    steps = [PlanStep(depth, name, plan, first if first is not None else check(plan))]
    current = plan
    for graph in sorted(impact, key=lambda g: -impact[g]):
        if steps[-1].verdict.within:
            break
        back = fallback.get(graph)
        current = current.replaced(*graph, back)
        to = back.backend.name if back is not None else "its forward"
        label = f"{name}: {graph[0] or '<model>'} back to {to} (impact {impact[graph]:.2g})"
        steps.append(PlanStep(depth, label, current, check(current)))
    return steps


def results_kept(plan: Plan, fallback: Mapping[GraphId, PlanEntry | None]) -> Plan:
    """``plan`` with every results-changing graph back on its fallback."""
    kept = plan
    for entry in plan.entries:
        if not entry.backend.preserves_results:
            kept = kept.replaced(entry.path, entry.key, fallback.get((entry.path, entry.key)))
    return kept
