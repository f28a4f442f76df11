"""auto_tune(): tune every cut depth, measure each end to end, keep the fastest.

Each depth is measured end to end in one interleaved ``measure`` call with the untuned
model (the tuned model is a shallow copy, so both exist at once): every depth's speed-up is
a side-by-side ratio, which a load change between depths does not move. When the spread
of those timings is larger than the gap they decide on, the depth is measured again, and
if it stays noisy the table says so and a warning names the likely cause (the load
average). At each depth the greedy plan (each graph's own winner) is measured against the
best single-runtime plan (every graph on the runtime that won most graphs, eager
elsewhere), because runtimes' thread pools can disturb each other; the faster is kept. Last,
the selected plan is timed beside depth 0's best whole-model backend (:mod:`.rival`).
Among depths within ``tie_tolerance`` of the best speed-up the shallowest wins; when no
depth beats the untuned model, the model stays untuned.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable
from typing import Any, Literal

import torch

from .._util.progress import Progress
from ..accuracy.budget import AccuracyBudget
from ..cache import open_cache
from ..candidates.budget import (
    END_TO_END,
    INSPECTION,
    SETUP,
    Deadline,
    Stopwatch,
    now,
)
from ..candidates.measure import MeasureConfig, Timing
from ..candidates.strategy import Strategy, accuracy_strategy, default_strategy, quick_strategy
from ..errors import InvalidInputError
from ..generation import is_generation
from ..runtime.wrap import wrap
from ..signature.compare import Tolerances
from ..signature.inspection import ModelInfo, inspect
from ..signature.modules import CallFn
from ..signature.shapes import DynamicShapes
from ..signature.state import (
    check_eval_mode,
    eval_mode,
    preserved_state,
    tensor_placement,
)
from .accuracy_check import EndToEndCheck
from .auto_result import AutoTuneResult, DepthRow, DepthStatus
from .decision import DepthDecisions
from .depths import (
    DepthRun,
    accuracy_record,
    against_fastest_untuned,
    check_outputs,
    fastest_untuned_s,
    select_depth,
    tune_depths,
)
from .endtoend import (
    UNTUNED,
    side_by_side,
)
from .rival import WHOLE_MODEL, FinalCheck, FinalRun, final_check, whole_model_plan
from .stateful_first import stateful_first
from .tune import (
    GraphCache,
    check_device,
    check_untuned,
    release_unplanned,
)

log = logging.getLogger(__name__)
MAX_DEFAULT_DEPTH = 3
"""Default deepest depth tried: deeper cuts wrap many tiny modules and rarely win."""
QUICK_MAX_DEPTH = 1
"""Deepest depth ``quick=True`` tries by default."""
DEFAULT_TIME_BUDGET_S = 300.0
"""``time_budget="default"``: five minutes, a few ``torch.compile`` first calls of a large model."""
QUICK_TIME_BUDGET_S = 60.0
"""``time_budget="default"`` with ``quick=True``."""
END_TO_END_RESERVE = 0.25
"""The most of a budget kept for the end-to-end measurement of the depth in progress."""
UNTUNED_SHARE = 0.1
"""The most of a budget the untuned model's first measurement may take."""


def auto_tune(
    model: Any,
    dataset: Iterable[Any],
    *,
    min_depth: int = 0,
    max_depth: int | None = None,
    strategy: Strategy | None = None,
    device: torch.device | str | None = None,
    tie_tolerance: float = 0.02,
    time_budget: float | Literal["default"] | None = "default",
    quick: bool = False,
    dry_run: bool = False,
    call: CallFn | None = None,
    tolerances: Tolerances | None = None,
    measure_config: MeasureConfig | None = None,
    verbose: bool = True,
    cache: GraphCache | str | os.PathLike[str] | bool | None = None,
    dynamic_shapes: DynamicShapes = None,
    allow_training: bool = False,
    accuracy: AccuracyBudget | None = None,
    reuse_decision: bool = True,
) -> AutoTuneResult:
    """Tune every distinct cut from ``min_depth`` to ``max_depth`` and keep the fastest depth.

    Each depth is measured end to end side by side with the untuned model on ``dataset``; the best
    speed-up wins (the shallowest within ``tie_tolerance``), or the untuned model when no depth
    beats it.

    ``strategy=None`` uses :func:`tunetree.default_strategy` for the device; every graph
    gets its own copy. A graph tuned at one depth is reused at every other depth that
    wraps the same module with the same graph, and a depth whose plan is one already measured
    is not measured again.

    ``time_budget`` (seconds, counted from the call; ``"default"``:
    :data:`DEFAULT_TIME_BUDGET_S`, 300 s, or :data:`QUICK_TIME_BUDGET_S`, 60 s, with
    ``quick``; None: unlimited) is held within about 10 %: no depth, graph, build or
    measurement is started that is expected to cross it (a build is expected to take as long
    as the longest one of its backend so far), up to a quarter of the budget is kept for the
    end-to-end measurement of the depth in progress, and measurements stop their trials at
    it. The skipped work is marked "time budget used up" (``result.skipped()`` lists it);
    eager is always there, so a depth cut short keeps what was measured.

    ``quick=True`` is a first look: only backends that build quickly
    (:func:`tunetree.quick_strategy`, when ``strategy`` is None), depths up to
    :data:`QUICK_MAX_DEPTH` (when ``max_depth`` is None), shorter measurements
    (:meth:`MeasureConfig.first_look`, when ``measure_config`` is None) and a 60 s budget.

    ``print(result)`` and ``result.timing()`` show where the time went, by phase.
    ``dry_run`` reports what each depth would wrap and tunes nothing. Progress goes to stderr
    unless ``verbose=False``. ``cache`` is the tuning cache consulted per graph, as in
    :func:`tunetree.tune` (None: the default directory; False: none). ``dynamic_shapes`` as
    in :func:`tunetree.tune`; every depth is measured on the same mix of recorded shapes.
    Training-mode models are refused unless ``allow_training=True`` (as in
    :func:`tunetree.tune`); the model's buffers, parameters and the RNG state are never changed.

    ``accuracy`` (a :class:`tunetree.AccuracyBudget`) opts into results that change: the
    strategy (when None, :func:`tunetree.accuracy_strategy`) adds reduced-precision candidates,
    each admitted by its measured error on its module's outputs; each depth's plan is then
    checked end to end on the tuning inputs, on the held-out share of ``dataset`` (not used to
    choose) and with the budget's ``evaluate``, and repaired graph by graph, largest error
    first, until it holds the budget. ``print(result)`` shows every plan checked and
    ``result.pareto()`` their latency against error.

    ``reuse_decision``: the depth chosen is recorded in the tuning cache (and its remote); a
    later call with the same key whose recorded plan comes whole from the cache checks it
    against eager, measures it once beside the untuned model and no other depth
    (:mod:`tunetree.search.decision`). False: every depth is measured.
    """
    _check_arguments(min_depth, max_depth, tie_tolerance)
    start = now()
    clock = Stopwatch()
    budget = _budget_s(time_budget, quick)
    check_untuned(model)
    if not allow_training:
        check_eval_mode(model)
    dev = check_device(model, device)
    progress = Progress(verbose)
    if quick and max_depth is None:
        max_depth = max(min_depth, QUICK_MAX_DEPTH)
    held: list[Any] = []
    if accuracy is not None:
        dataset, held = accuracy.split(list(dataset))
    with preserved_state(model), eval_mode(model):
        progress("inspecting the model")
        with clock.phase(INSPECTION):
            info = inspect(
                model,
                dataset,
                call=call,
                device=dev,
                dynamic_shapes=dynamic_shapes,
                max_depth=MAX_DEFAULT_DEPTH if max_depth is None else max_depth,
            )
        rows = _depth_rows(info, min_depth, max_depth)
        if not rows:
            fused = f"; {info.fast_path_note()}" if info.fused else ""
            raise InvalidInputError(
                f"no depth to try: min_depth={min_depth} is deeper than the model's deepest "
                f"executed module (depth {info.max_depth}){fused}"
            )
        if info.fused:
            log.warning("auto_tune: %s", info.fast_path_note())
        if dry_run:
            for row in rows:
                row.status = DepthStatus.DRY_RUN
            return AutoTuneResult(model, None, rows, None, info=info, dry_run=True, original=model)
        with clock.phase(SETUP):
            run = DepthRun(
                model=model,
                info=info,
                call=call,
                config=measure_config or (MeasureConfig.first_look() if quick else MeasureConfig()),
                # built once: log lines appear once
                strategy=strategy or _strategy(dev, quick, accuracy),
                tolerances=tolerances,
                progress=progress,
                cache=open_cache(cache),
                devices=tensor_placement(model),
                deadline=None if budget is None else Deadline.after(budget, start),
                clock=clock,
                generation=is_generation(info, model),
            )
            nothing = _nothing_to_try(run.strategy, dev)
            if nothing:
                log.warning("auto_tune leaves the model untuned: %s", nothing)
                for row in rows:
                    row.status, row.error = DepthStatus.SKIPPED, nothing
                return AutoTuneResult(
                    model, None, rows, None, info=info, original=model, tuning_s=now() - start
                )
            if accuracy is not None:
                progress("accuracy budget: eager's references for the held-out inputs")
                run.accuracy = EndToEndCheck.prepare(accuracy, model, info, held, call)
        result, decisions = _tune(
            run, rows, held, dev, budget, tie_tolerance, reuse_decision, start
        )
    if decisions is not None:
        decisions.finish(result)
    result.tuning_s = now() - start
    result.breakdown = clock.breakdown()
    result.time_budget = budget
    result.accuracy = accuracy
    return result


def _tune(
    run: DepthRun,
    rows: list[DepthRow],
    held: list[Any],
    dev: torch.device,
    budget: float | None,
    tie_tolerance: float,
    reuse_decision: bool,
    start: float,
) -> tuple[AutoTuneResult, DepthDecisions | None]:
    """The whole-model stateful runner for generate first, else the depths' search.

    Returns the result and the decisions to record (None when the stateful runner serves).
    """
    whole, trials = stateful_first(run, rows, held, dev)
    if whole is not None:
        return whole, None
    decisions = DepthDecisions.open(run, rows, tie_tolerance, reuse_decision)
    before = decisions.try_reuse()
    if before is None:
        before = _search(run, rows, budget)
    result = _finish(run, rows, before, tie_tolerance, start)  # still in eval mode
    result.stateful = trials
    return result, decisions


def _nothing_to_try(strategy: Strategy, dev: torch.device) -> str:
    """Why no candidate but eager can run on ``dev`` ("" when one can).

    Tuning would then only measure eager, so it is not started.
    """
    reasons = []
    for backend in strategy.backends:
        if backend.kind == "eager":
            continue
        reason = backend.unavailable_reason(dev)
        if reason is None:
            return ""
        reasons.append(f"{backend.name}: {reason}")
    if not reasons:
        return ""  # an eager-only strategy is asked for: it is measured as asked
    return f"no candidate but eager can run on {dev} ({'; '.join(reasons)})"


def _strategy(dev: torch.device, quick: bool, accuracy: AccuracyBudget | None) -> Strategy:
    """The strategy when none is given: the budget's candidates too when there is one."""
    if accuracy is not None:
        return accuracy_strategy(dev, quick=quick)
    return quick_strategy(dev) if quick else default_strategy(dev)


def _search(run: DepthRun, rows: list[DepthRow], budget: float | None) -> Timing:
    """The full search: the untuned model measured, then every depth; the untuned timing."""
    run.progress("measuring the untuned model")
    measured_at = now()
    with run.clock.phase(END_TO_END, UNTUNED):
        before = _measure_untuned(run, budget)
    if budget is not None:
        run.reserve_s = _end_to_end_reserve(
            before, now() - measured_at, run.end_to_end_config, budget
        )
    tune_depths(run, rows)
    return before


def _measure_untuned(run: DepthRun, budget: float | None) -> Timing:
    """The untuned model's first measurement; at most a tenth of a budget's time."""
    config = run.end_to_end_config
    if budget is not None:
        cap = min(config.max_s_per_candidate, UNTUNED_SHARE * budget)
        config = dataclasses.replace(config, max_s_per_candidate=cap)
    return side_by_side(
        {UNTUNED: run.model},
        run.info,
        run.call,
        config,
        deadline=run.deadline,
        samples=run.end_to_end_samples,
    )[UNTUNED]


def _end_to_end_reserve(
    untuned: Timing, measured_s: float, config: MeasureConfig, budget: float
) -> float:
    """Budget seconds kept for a depth's end-to-end check and measurement.

    It times the untuned model and a tuned one: as long as two measurements of the untuned
    model took, at most :data:`END_TO_END_RESERVE` of the budget, but never less than the
    shortest useful measurement of the two (a depth that cannot have it is not started).
    """
    block = untuned.median_s * (untuned.calls_per_trial + 1)
    least = 2 * (
        config.warmup_s
        + untuned.median_s * (config.min_warmup_calls + 1)  # + the end-to-end check
        + config.min_trials * block
    )
    return max(least, min(2 * measured_s, END_TO_END_RESERVE * budget))


def _budget_s(time_budget: float | Literal["default"] | None, quick: bool) -> float | None:
    """The budget in seconds (None: unlimited); refuses a negative one."""
    if time_budget == "default":
        return QUICK_TIME_BUDGET_S if quick else DEFAULT_TIME_BUDGET_S
    if time_budget is None:
        return None
    if isinstance(time_budget, str) or time_budget < 0:
        raise InvalidInputError(
            f"time_budget must be seconds >= 0, None or 'default', got {time_budget!r}"
        )
    return float(time_budget)


def _finish(
    run: DepthRun, rows: list[DepthRow], before: Timing, tie_tolerance: float, start: float
) -> AutoTuneResult:
    """Pick the depth and wrap the model with its plan.

    ``untuned_after`` is the untuned timing taken beside the last measured depth.
    """
    measured = [r for r in rows if r.untuned is not None and r.same_as is None]
    after = measured[-1].untuned if measured else None
    untuned = min((t for t in (before, after) if t is not None), key=lambda t: t.median_s)
    against_fastest_untuned(measured, before)
    selected = select_depth(rows, tie_tolerance)
    final = _final_check(run, rows, selected, tie_tolerance, before)
    if final is not None and final.kept_rival:  # depth 0 now holds the rival, timed again
        selected = 0
        against_fastest_untuned([r for r in rows if r.untuned and r.same_as is None], before)
    if run.accuracy is not None:
        for depth, measured_plan in run.plans.items():
            measured_plan.accuracy = accuracy_record(
                run.accuracy.budget, next(r for r in rows if r.depth == depth)
            )
    result = AutoTuneResult(
        run.model,
        None,
        rows,
        untuned,
        before,
        after,
        graphs=run.graphs,
        info=run.info,
        original=run.model,
        plans=dict(run.plans),
        final="" if final is None else str(final),
    )
    if selected is not None:
        result.use(selected)
    release_unplanned(run.graphs.values(), run.plans.values())  # result.use picks among those
    result.tuning_s = now() - start
    return result


def _final_check(
    run: DepthRun,
    rows: list[DepthRow],
    selected: int | None,
    tie_tolerance: float,
    before: Timing,
) -> FinalCheck | None:
    """The best whole-model backend of depth 0 beside the selected plan (:mod:`.rival`)."""
    rival = whole_model_plan(run.graphs[0]) if run.accuracy is None and 0 in run.graphs else None
    if rival is None or not rival.runners():
        return None

    def measure(models: dict[str, Any]) -> dict[str, Timing]:
        run.progress("final", "the selected plan beside the best whole-model backend")
        with run.clock.phase(END_TO_END, "final side by side"):
            return run.measure(models)

    final_run = FinalRun(
        untuned=run.model,
        wrap_plan=lambda plan: wrap(run.model, plan.runners(), in_place=False),
        problems=lambda model, plan: check_outputs(run, model, plan),
        measure=measure,
        restore=run.restore,
        room=lambda: run.deadline is None or run.deadline.room_for_s(run.reserve_s),
    )
    measured = [r for r in rows if r.same_as is None]
    fastest = fastest_untuned_s(measured, before)
    final = final_check(final_run, run.plans, selected, rival, tie_tolerance, fastest)
    if final is not None and final.kept_rival:
        row = next(r for r in rows if r.depth == 0)
        run.plans[0] = rival
        row.status, row.error, row.noisy = DepthStatus.MEASURED, "", False
        row.timing, row.untuned = final.timings[WHOLE_MODEL], final.timings[UNTUNED]
        row.plans = f"whole-model {final.rival}, kept by the final side by side"
    return final


def _check_arguments(min_depth: int, max_depth: int | None, tie_tolerance: float) -> None:
    if min_depth < 0 or (max_depth is not None and max_depth < min_depth):
        raise InvalidInputError(f"need 0 <= min_depth <= max_depth, got {min_depth}, {max_depth}")
    if tie_tolerance < 0:
        raise InvalidInputError("tie_tolerance must be >= 0")


def _depth_rows(info: ModelInfo, min_depth: int, max_depth: int | None) -> list[DepthRow]:
    """One row per depth tried.

    ``max_depth`` (default :data:`MAX_DEFAULT_DEPTH`) is capped at the model's deepest depth.
    """
    last = min(info.max_depth, MAX_DEFAULT_DEPTH) if max_depth is None else max_depth
    last = min(last, info.max_depth)
    return [
        DepthRow(d, s.modules, s.graphs)
        for d in range(min_depth, last + 1)
        for s in [info.summary(d)]
    ]
