"""The depths of one :func:`~tunetree.search.auto.auto_tune` call: tune each cut, measure it.

:class:`DepthRun` holds what the depths share (model, calls, strategy, cache, deadline, the
plans and graph results each depth leaves); :func:`tune_depths` tunes and measures each
depth in turn (the greedy plan against the best single-runtime plan, both beside the untuned
model); :func:`select_depth` picks the shallowest depth within the tie tolerance of the best
speed-up. Split from ``auto`` so that the entry point reads as the flow it runs.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from .._util.progress import Progress
from .._util.table import format_seconds
from ..accuracy.budget import AccuracyBudget
from ..candidates.budget import (
    END_TO_END,
    END_TO_END_CHECK,
    TIME_BUDGET_ERROR,
    Deadline,
    Stopwatch,
    now,
)
from ..candidates.measure import MeasureConfig, Timing
from ..candidates.strategy import Strategy
from ..candidates.why import why_no_gain
from ..generation import end_to_end_config, end_to_end_samples
from ..runtime.plan import Plan
from ..runtime.wrap import unwrap, wrap
from ..signature.compare import Tolerances
from ..signature.inspection import ModelInfo
from ..signature.modules import CallFn
from ..signature.state import (
    Placement,
    restore_placement,
)
from .accuracy_check import EndToEndCheck
from .auto_result import DepthRow, DepthStatus
from .endtoend import (
    UNTUNED,
    load_text,
    output_problem,
    runtime_name,
    side_by_side,
    single_runtime_plan,
    too_noisy,
)
from .serving import mark_unserved
from .tune import (
    GraphCache,
    GraphMemo,
    GraphResult,
    plan_from,
)
from .tune import tune_cut as _tune_cut

log = logging.getLogger(__name__)

MAX_PLANS_TIMED = 6
"""Under an accuracy budget, the most plans of one depth timed end to end (the first ones
checked, and the first within the budget); the rest show their error only."""


def against_fastest_untuned(measured: list[DepthRow], before: Timing) -> None:
    """Each depth's speed-up against the fastest untuned timing of the run.

    A runtime measured beside the untuned model can slow it down (ONNX Runtime's or
    OpenVINO's threads stay busy after their calls, many times over on a small CPU), which
    would flatter the plan measured with it and choose a depth that is no faster. The untuned
    model is only ever slowed by such company, so its fastest timing is the honest reference.
    """
    reference = fastest_untuned_s(measured, before)
    for row in measured:
        if row.timing is not None and row.timing.median_s > 0:
            row.speedup = reference / row.timing.median_s
        for step in row.steps:
            if step.latency_s:
                step.speedup = reference / step.latency_s


def fastest_untuned_s(measured: list[DepthRow], before: Timing) -> float:
    """The untuned model's fastest median of the run: before tuning or beside a depth."""
    return min([before.median_s, *(r.untuned.median_s for r in measured if r.untuned)])


@dataclass
class DepthRun:
    """What the depths of one :func:`auto_tune` call share, and what they leave behind."""

    model: Any
    info: ModelInfo
    call: CallFn | None
    config: MeasureConfig
    strategy: Strategy
    tolerances: Tolerances | None
    progress: Progress
    cache: GraphCache | None
    devices: Placement
    deadline: Deadline | None
    clock: Stopwatch = field(default_factory=Stopwatch)
    accuracy: EndToEndCheck | None = None
    """The accuracy budget's end-to-end check (None: results are kept)."""
    generation: bool = False
    """The calls are ``generate``'s steps: the decode graph is tuned first, and end-to-end
    measurements time one representative prompt (:mod:`tunetree.generation.plan`)."""
    reserve_s: float = 0.0
    """Budget seconds kept for a depth's end-to-end measurement while its graphs are tuned."""
    memo: GraphMemo = field(default_factory=dict)
    cuts: dict[tuple[str, ...], DepthRow] = field(default_factory=dict)
    measured_plans: dict[frozenset[tuple[str, Any, int]], DepthRow] = field(default_factory=dict)
    plans: dict[int, Plan] = field(default_factory=dict)
    graphs: dict[int, list[GraphResult]] = field(default_factory=dict)

    @property
    def end_to_end_config(self) -> MeasureConfig:
        """How end-to-end measurements are timed (fewer trials for generation)."""
        return end_to_end_config(self.config) if self.generation else self.config

    @property
    def end_to_end_samples(self) -> list[Any] | None:
        """What end-to-end measurements time (None: every sample)."""
        return end_to_end_samples(self.info) if self.generation else None

    def measure(self, models: dict[str, Any]) -> dict[str, Timing]:
        """End-to-end latency of each model (tuned or not), interleaved in one call."""
        return side_by_side(
            models,
            self.info,
            self.call,
            self.end_to_end_config,
            deadline=self.deadline,
            samples=self.end_to_end_samples,
        )

    def tune_cut(self, depth: int, cache: GraphCache | None) -> list[GraphResult]:
        """The cut at ``depth`` tuned with the run's settings, through ``cache``."""
        return _tune_cut(
            self.model,
            self.info,
            depth,
            strategy=self.strategy,
            tolerances=self.tolerances or Tolerances(),
            measure_config=self.config,
            progress=self.progress,
            memo=self.memo,
            cache=cache,
            deadline=self.deadline,
            clock=self.clock,
            accuracy=self.accuracy.budget if self.accuracy is not None else None,
            most_time_first=self.generation,
        )

    def restore(self) -> None:
        """Unwrap the model and put back every tensor a backend moved."""
        unwrap(self.model)
        restore_placement(self.devices)


def tune_depths(run: DepthRun, rows: list[DepthRow]) -> None:
    """Tune and measure each row's depth in turn; the model is left untuned, even on error."""
    try:
        for i, row in enumerate(rows):
            if run.deadline is not None:
                run.deadline.depths_after = len(rows) - i - 1
            _tune_depth(run, row)
    except BaseException:
        run.restore()
        raise


def _tune_depth(run: DepthRun, row: DepthRow) -> None:
    """Tune one depth's cut, check it end to end and measure it; the outcome goes in ``row``."""
    if run.deadline is not None and not run.deadline.room_for_s(run.reserve_s):
        row.status, row.error = DepthStatus.SKIPPED, TIME_BUDGET_ERROR
        return
    cut = tuple(run.info.cut(row.depth))
    twin = run.cuts.get(cut)
    if twin is not None:
        row.status, row.same_as = DepthStatus.SAME_CUT, twin.depth
        row.timing, row.error, row.speedup = twin.timing, twin.error, twin.speedup
        return
    run.cuts[cut] = row
    left = f", budget left {run.deadline.left_s():.0f} s" if run.deadline is not None else ""
    run.progress(f"depth {row.depth}", f"{row.modules} modules, {row.graphs} graphs{left}")
    reserve = run.deadline.reserving(run.reserve_s) if run.deadline is not None else nullcontext()
    with reserve:
        results = run.tune_cut(row.depth, run.cache)
    restore_placement(run.devices)
    run.graphs[row.depth] = results
    skipped = sum(1 for g in results for r in g.rows if r.reason == TIME_BUDGET_ERROR)
    if skipped:
        row.error = f"{TIME_BUDGET_ERROR}: {skipped} candidates skipped"
    plan = plan_from(results, row.depth)
    if not plan.entries:
        why = why_no_gain(results)
        row.status = DepthStatus.SKIPPED
        row.error = (
            TIME_BUDGET_ERROR  # the budget is why nothing is left, not the backends
            if skipped
            else "every module failed to tune" + (f" ({why})" if why else "")
        )
        return
    if not plan.runners():
        row.status = DepthStatus.NO_CHANGE
        row.error = "; ".join(e for e in (why_no_gain(results), row.error) if e)
        return
    if not _same_plan(run, row, plan):
        _measure_depth(run, row, plan)


def _same_plan(run: DepthRun, row: DepthRow, plan: Plan) -> bool:
    """Whether ``plan`` installs exactly the runners of a depth measured before.

    That depth's row then stands for this one too (the wrapped models are the same), and this
    depth is not measured again.
    """
    signature = plan.signature()
    twin = run.measured_plans.get(signature)
    if twin is None:
        run.measured_plans[signature] = row
        return False
    row.status, row.same_as = DepthStatus.SAME_PLAN, twin.depth
    row.timing, row.speedup, row.untuned = twin.timing, twin.speedup, twin.untuned
    return True


def _measure_depth(run: DepthRun, row: DepthRow, plan: Plan) -> None:
    """Check the depth's plans end to end against eager, then keep the faster one.

    The plans' outputs are compared with eager's, then they are timed side by side with the untuned
    model.
    """
    plans = {"greedy": plan}
    single = single_runtime_plan(run.graphs[row.depth], row.depth)
    if single is not None and single.runners():
        plans["single"] = single
    if run.accuracy is not None:
        _measure_budgeted_depth(run, row, plans)
        return
    try:
        tuned = {name: wrap(run.model, p.runners(), in_place=False) for name, p in plans.items()}
        with run.clock.phase(END_TO_END_CHECK):
            problems = {name: check_outputs(run, m, plans[name]) for name, m in tuned.items()}
        mark_unserved(tuned["greedy"], run.graphs[row.depth])
        tuned = {name: m for name, m in tuned.items() if not problems[name]}
        if not tuned:
            row.status = DepthStatus.REJECTED
            row.error = f"end-to-end output: {problems['greedy']}"
            return
        run.progress(f"depth {row.depth}", "measuring end to end beside the untuned model")
        with run.clock.phase(END_TO_END, f"depth {row.depth}"):
            timings = _timed(run, row, tuned)
        _keep_fastest(run, row, plans, timings, list(tuned))
    except Exception as exc:
        row.status, row.error = DepthStatus.FAILED, f"{type(exc).__name__}: {exc}"
    finally:
        run.restore()


def _measure_budgeted_depth(run: DepthRun, row: DepthRow, plans: dict[str, Plan]) -> None:
    """Fit the depth's plans into the accuracy budget, then time every plan checked.

    The fastest plan within the budget is the depth's; the others' latencies are for
    :meth:`AutoTuneResult.pareto`.
    """
    check = run.accuracy
    assert check is not None
    try:
        run.progress(f"depth {row.depth}", "checking plans against the accuracy budget")
        with run.clock.phase(END_TO_END_CHECK):
            row.steps = check.fit(run.model, row.depth, plans, run.graphs[row.depth])
        within = [s for s in row.steps if s.verdict.within]
        if not within:
            row.status = DepthStatus.REJECTED
            last = row.steps[-1].verdict.reason if row.steps else "no plan"
            row.error = f"no plan holds the accuracy budget ({last})"
            return
        timed = {f"plan {i}": s for i, s in enumerate(row.steps[:MAX_PLANS_TIMED])}
        if not any(s.verdict.within for s in timed.values()):
            timed[f"plan {row.steps.index(within[0])}"] = within[0]
        tuned = {n: wrap(run.model, s.plan.runners(), in_place=False) for n, s in timed.items()}
        run.progress(f"depth {row.depth}", f"measuring {len(tuned)} plans beside the untuned model")
        with run.clock.phase(END_TO_END, f"depth {row.depth}"):
            timings = _timed(run, row, tuned)
        for name, step in timed.items():
            step.latency_s = timings[name].median_s  # speed-ups: against_fastest_untuned
        best = _fastest([n for n, s in timed.items() if s.verdict.within], timings)
        _keep(run, row, timed[best].plan, timings[best], timings[UNTUNED])
        timed[best].chosen = True
    except Exception as exc:
        row.status, row.error = DepthStatus.FAILED, f"{type(exc).__name__}: {exc}"
    finally:
        run.restore()


def accuracy_record(budget: AccuracyBudget, row: DepthRow) -> dict[str, Any]:
    """What a checkpoint records of the budget and the chosen plan's measured error."""
    step = row.chosen_step
    verdict = step.verdict if step is not None else None
    return {
        "budget": budget.to_json(),
        "error": verdict.error if verdict else None,
        "heldout_error": verdict.heldout_error if verdict else None,
        "score_drop": verdict.score_drop if verdict else None,
        "changes_results": bool(step and step.plan.changes_results()),
    }


def _keep_fastest(
    run: DepthRun,
    row: DepthRow,
    plans: dict[str, Plan],
    timings: dict[str, Timing],
    names: list[str],
) -> None:
    """Record the faster of the depth's measured plans in ``row`` and ``run.plans``."""
    best = _fastest(names, timings)
    _keep(run, row, plans[best], timings[best], timings[UNTUNED])
    if len(names) > 1:
        row.plans = (
            ", ".join(
                f"{runtime_name(plans[n])} {format_seconds(timings[n].median_s)}" for n in names
            )
            + f": kept {runtime_name(plans[best])}"
        )


def _fastest(names: list[str], timings: dict[str, Timing]) -> str:
    return min(names, key=lambda name: timings[name].median_s)


def _keep(run: DepthRun, row: DepthRow, plan: Plan, timing: Timing, untuned: Timing) -> None:
    """Make ``plan``, measured at ``timing`` beside ``untuned``, the depth's measured plan."""
    run.plans[row.depth] = plan
    row.timing, row.untuned = timing, untuned
    row.speedup = untuned.median_s / timing.median_s
    row.status = DepthStatus.MEASURED


def check_outputs(run: DepthRun, tuned: Any, plan: Plan) -> str:
    """Why ``tuned``'s outputs do not match eager's ("" when they do)."""
    return output_problem(run.info, run.call, tuned, plan, run.tolerances)


def _timed(run: DepthRun, row: DepthRow, tuned: dict[str, Any]) -> dict[str, Timing]:
    """Time the tuned models and the untuned one in one interleaved measurement.

    Measured again once when too noisy to separate them (when the budget has room for it), then
    flagged (with a warning naming the load).
    """
    models = {UNTUNED: run.model, **tuned}
    started = now()
    timings = run.measure(models)
    if not too_noisy(timings):
        return timings
    if run.deadline is not None and not run.deadline.room_for_s(now() - started):
        row.noisy = True
        log.warning(
            "depth %d: end-to-end timings too spread and no time left to measure again (%s)",
            row.depth,
            load_text(),
        )
        return timings
    run.progress(f"depth {row.depth}", "timings too spread: measuring again")
    timings = run.measure(models)
    if too_noisy(timings):
        row.noisy = True
        log.warning(
            "depth %d: end-to-end timings stay too spread to tell the candidates apart "
            "(%s); likely cause: another process is using the machine (%s)",
            row.depth,
            ", ".join(f"{n} {t}" for n, t in timings.items()),
            load_text(),
        )
    return timings


def select_depth(rows: list[DepthRow], tie_tolerance: float) -> int | None:
    """The shallowest depth within ``tie_tolerance`` of the best side-by-side speed-up.

    Returned only if it beats the untuned model.
    """
    measured = [r for r in rows if r.speedup is not None and r.same_as is None]
    if not measured:
        return None
    best = max(r.speedup for r in measured if r.speedup is not None)
    tied = [
        r for r in measured if r.speedup is not None and r.speedup * (1 + tie_tolerance) >= best
    ]
    choice = min(tied, key=lambda r: r.depth)
    if choice.speedup is None or choice.speedup <= 1.0:
        return None
    return choice.depth
