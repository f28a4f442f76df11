from __future__ import annotations

import dataclasses

import pytest

from tests.fakes import Delayed
from tunetree.accuracy import Verdict, repair, results_kept
from tunetree.backends import Autocast
from tunetree.runtime.plan import Plan, PlanEntry
from tunetree.signature.graph import GraphKey

pytestmark = pytest.mark.usefixtures("virtual_time")
"""Every test here decides on timings its fakes declare (``tests/clock.py``, issue 33)."""


def entry(path: str, backend) -> PlanEntry:
    return PlanEntry(path, GraphKey((), ()), backend, runner=object())  # type: ignore[arg-type]


def test_graphs_go_back_largest_error_first_until_within() -> None:
    lossy = Autocast("bf16")
    plan = Plan([entry("a", lossy), entry("b", lossy), entry("c", lossy)], depth=1)
    impact = {(p, GraphKey((), ())): e for p, e in {"a": 0.001, "b": 0.004, "c": 0.002}.items()}
    keep = entry("b", Delayed())
    fallback = {(p, GraphKey((), ())): (keep if p == "b" else None) for p in "abc"}

    def check(candidate: Plan) -> Verdict:
        # The plan's error: the sum of its lossy graphs' errors.
        error = sum(
            impact[(e.path, e.key)] for e in candidate.entries if not e.backend.preserves_results
        )
        return Verdict(error <= 0.0035, error, reason="" if error <= 0.0035 else "over")

    steps = repair(1, "greedy", plan, impact, fallback, check)
    assert [round(s.verdict.error, 4) for s in steps] == [0.007, 0.003]
    assert steps[-1].verdict.within and not steps[0].verdict.within
    assert "b back to fake-delayed" in steps[1].label
    backends = {e.path: e.backend.kind for e in steps[-1].plan.entries}
    assert backends == {"a": "autocast", "b": "fake-delayed", "c": "autocast"}
    # A plan within the budget at once is checked once.
    assert len(repair(1, "greedy", plan, impact, fallback, lambda p: Verdict(True, 0.0))) == 1
    # The plan that keeps every result: b on its fallback, a and c on their forward.
    kept = results_kept(plan, fallback)
    assert [(e.path, e.backend.kind) for e in kept.entries] == [("b", "fake-delayed")]
    assert not kept.changes_results() and plan.changes_results()


def test_repair_runs_out_when_even_the_results_keeping_plan_fails() -> None:
    lossy = dataclasses.replace(Autocast("bf16"))
    plan = Plan([entry("a", lossy)])
    steps = repair(0, "greedy", plan, {("a", GraphKey((), ())): 0.1}, {}, lambda p: Verdict(False))
    assert len(steps) == 2 and not any(s.verdict.within for s in steps)
    assert "a back to its forward" in steps[-1].label
