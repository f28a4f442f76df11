"""auto_tune(): tune every cut depth, measure each end to end, keep the fastest.

Each depth is measured end to end in one interleaved ``measure`` call with the untuned
model (the tuned model is a shallow copy, so both exist at once): every depth's speed-up is
a side-by-side ratio, which a load change between depths does not move. When the spread
of those timings is larger than the gap they decide on, the depth is measured again, and
if it stays noisy the table says so and a warning names the likely cause (the load
average). At each depth the greedy plan (each graph's own winner) is measured against the
best single-runtime plan (every graph on the runtime that won most graphs, eager
elsewhere), because runtimes' thread pools can disturb each other; the faster is kept.
Among depths within ``tie_tolerance`` of the best speed-up the shallowest wins; when no
depth beats the untuned model, the model stays untuned.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .._util.progress import Progress
from .._util.table import format_seconds
from ..accuracy.budget import AccuracyBudget
from ..cache import open_cache
from ..candidates.budget import (
    END_TO_END,
    END_TO_END_CHECK,
    INSPECTION,
    SETUP,
    TIME_BUDGET_ERROR,
    Deadline,
    Stopwatch,
    now,
)
from ..candidates.measure import MeasureConfig, Timing
from ..candidates.strategy import Strategy, accuracy_strategy, default_strategy, quick_strategy
from ..errors import InvalidInputError
from ..runtime.plan import Plan
from ..runtime.wrap import unwrap, wrap
from ..signature.compare import Tolerances, compare_all
from ..signature.inspection import ModelInfo, inspect
from ..signature.modules import CallFn, module_paths, run_model
from ..signature.shapes import DynamicShapes
from ..signature.state import check_eval_mode, eval_mode, preserved_state
from .accuracy_check import EndToEndCheck
from .auto_result import AutoTuneResult, DepthRow, DepthStatus
from .endtoend import UNTUNED, load_text, runtime_name, side_by_side, single_runtime_plan, too_noisy
from .serving import mark_unserved
from .tune import GraphCache, GraphMemo, GraphResult, check_device, check_untuned, plan_from
from .tune import tune_cut as _tune_cut

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
MAX_PLANS_TIMED = 6
"""Under an accuracy budget, the most plans of one depth timed end to end (the first ones
checked, and the first within the budget); the rest show their error only."""


Placement = dict[tuple[int, str], tuple[torch.nn.Module, torch.device, torch.dtype]]


def _tensor_devices(model: Any) -> Placement:
    """Device and dtype of every parameter and buffer, to put back what a backend moved."""
    found: Placement = {}
    for _, module in module_paths(model):
        for name, tensor in list(module.named_parameters(recurse=False)) + list(
            module.named_buffers(recurse=False)
        ):
            if tensor is not None:
                found[(id(module), name)] = (module, tensor.device, tensor.dtype)
    return found


def _restore_devices(saved: Placement) -> None:
    for (_, name), (module, device, dtype) in saved.items():
        tensor = getattr(module, name, None)
        if isinstance(tensor, torch.Tensor) and (tensor.device, tensor.dtype) != (device, dtype):
            tensor.data = tensor.data.to(device=device, dtype=dtype)


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
            info = inspect(model, dataset, call=call, device=dev, dynamic_shapes=dynamic_shapes)
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
            run = _Run(
                model=model,
                info=info,
                call=call,
                config=measure_config or (MeasureConfig.first_look() if quick else MeasureConfig()),
                # built once: log lines appear once
                strategy=strategy or _strategy(dev, quick, accuracy),
                tolerances=tolerances,
                progress=progress,
                cache=open_cache(cache),
                devices=_tensor_devices(model),
                deadline=None if budget is None else Deadline.after(budget, start),
                clock=clock,
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
        progress("measuring the untuned model")
        measured_at = now()
        with clock.phase(END_TO_END, UNTUNED):
            before = _measure_untuned(run, budget)
        if budget is not None:
            run.reserve_s = _end_to_end_reserve(before, now() - measured_at, run.config, budget)
        _tune_depths(run, rows)
    result = _finish(run, rows, before, tie_tolerance, start)
    result.breakdown = clock.breakdown()
    result.time_budget = budget
    result.accuracy = accuracy
    return result


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


def _measure_untuned(run: _Run, budget: float | None) -> Timing:
    """The untuned model's first measurement; at most a tenth of a budget's time."""
    config = run.config
    if budget is not None:
        cap = min(config.max_s_per_candidate, UNTUNED_SHARE * budget)
        config = dataclasses.replace(config, max_s_per_candidate=cap)
    return side_by_side({UNTUNED: run.model}, run.info, run.call, config, deadline=run.deadline)[
        UNTUNED
    ]


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
    run: _Run, rows: list[DepthRow], before: Timing, tie_tolerance: float, start: float
) -> AutoTuneResult:
    """Pick the depth and wrap the model with its plan.

    ``untuned_after`` is the untuned timing taken beside the last measured depth.
    """
    measured = [r for r in rows if r.untuned is not None and r.same_as is None]
    after = measured[-1].untuned if measured else None
    untuned = min((t for t in (before, after) if t is not None), key=lambda t: t.median_s)
    _against_fastest_untuned(measured, before)
    selected = _select(rows, tie_tolerance)
    if run.accuracy is not None:
        for depth, measured_plan in run.plans.items():
            measured_plan.accuracy = _accuracy_record(
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
    )
    if selected is not None:
        result.use(selected)
    result.tuning_s = now() - start
    return result


def _against_fastest_untuned(measured: list[DepthRow], before: Timing) -> None:
    """Each depth's speed-up against the fastest untuned timing of the run.

    A runtime measured beside the untuned model can slow it down (ONNX Runtime's or
    OpenVINO's threads stay busy after their calls: 20x was seen on a 2-core machine), which
    would flatter the plan measured with it and choose a depth that is no faster. The untuned
    model is only ever slowed by such company, so its fastest timing is the honest reference.
    """
    reference = min([before.median_s, *(r.untuned.median_s for r in measured if r.untuned)])
    for row in measured:
        if row.timing is not None and row.timing.median_s > 0:
            row.speedup = reference / row.timing.median_s
        for step in row.steps:
            if step.latency_s:
                step.speedup = reference / step.latency_s


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


@dataclass
class _Run:
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
    reserve_s: float = 0.0
    """Budget seconds kept for a depth's end-to-end measurement while its graphs are tuned."""
    memo: GraphMemo = field(default_factory=dict)
    cuts: dict[tuple[str, ...], DepthRow] = field(default_factory=dict)
    measured_plans: dict[frozenset[tuple[str, Any, int]], DepthRow] = field(default_factory=dict)
    plans: dict[int, Plan] = field(default_factory=dict)
    graphs: dict[int, list[GraphResult]] = field(default_factory=dict)

    def measure(self, models: dict[str, Any]) -> dict[str, Timing]:
        """End-to-end latency of each model (tuned or not), interleaved in one call."""
        return side_by_side(models, self.info, self.call, self.config, deadline=self.deadline)

    def restore(self) -> None:
        """Unwrap the model and put back every tensor a backend moved."""
        unwrap(self.model)
        _restore_devices(self.devices)


def _tune_depths(run: _Run, rows: list[DepthRow]) -> None:
    """Tune and measure each row's depth in turn; the model is left untuned, even on error."""
    try:
        for i, row in enumerate(rows):
            if run.deadline is not None:
                run.deadline.depths_after = len(rows) - i - 1
            _tune_depth(run, row)
    except BaseException:
        run.restore()
        raise


def _tune_depth(run: _Run, row: DepthRow) -> None:
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
        results = _tune_cut(
            run.model,
            run.info,
            row.depth,
            strategy=run.strategy,
            tolerances=run.tolerances or Tolerances(),
            measure_config=run.config,
            progress=run.progress,
            memo=run.memo,
            cache=run.cache,
            deadline=run.deadline,
            clock=run.clock,
            accuracy=run.accuracy.budget if run.accuracy is not None else None,
        )
    _restore_devices(run.devices)
    run.graphs[row.depth] = results
    skipped = sum(1 for g in results for r in g.rows if r.reason == TIME_BUDGET_ERROR)
    if skipped:
        row.error = f"{TIME_BUDGET_ERROR}: {skipped} candidates skipped"
    plan = plan_from(results, row.depth)
    if not plan.entries:
        reasons = [r.reason for g in results for r in g.rows if r.reason]
        row.status = DepthStatus.SKIPPED
        row.error = (
            TIME_BUDGET_ERROR  # the budget is why nothing is left, not the backends
            if skipped
            else "every module failed to tune" + (f" ({reasons[0]})" if reasons else "")
        )
        return
    if not plan.runners():
        row.status = DepthStatus.NO_CHANGE
        return
    if not _same_plan(run, row, plan):
        _measure_depth(run, row, plan)


def _same_plan(run: _Run, row: DepthRow, plan: Plan) -> bool:
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


def _measure_depth(run: _Run, row: DepthRow, plan: Plan) -> None:
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
            problems = {name: _check_outputs(run, m, plans[name]) for name, m in tuned.items()}
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


def _measure_budgeted_depth(run: _Run, row: DepthRow, plans: dict[str, Plan]) -> None:
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
            step.latency_s = timings[name].median_s  # speed-ups: _against_fastest_untuned
        best = _fastest([n for n, s in timed.items() if s.verdict.within], timings)
        _keep(run, row, timed[best].plan, timings[best], timings[UNTUNED])
        timed[best].chosen = True
    except Exception as exc:
        row.status, row.error = DepthStatus.FAILED, f"{type(exc).__name__}: {exc}"
    finally:
        run.restore()


def _accuracy_record(budget: AccuracyBudget, row: DepthRow) -> dict[str, Any]:
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
    run: _Run, row: DepthRow, plans: dict[str, Plan], timings: dict[str, Timing], names: list[str]
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


def _keep(run: _Run, row: DepthRow, plan: Plan, timing: Timing, untuned: Timing) -> None:
    """Make ``plan``, measured at ``timing`` beside ``untuned``, the depth's measured plan."""
    run.plans[row.depth] = plan
    row.timing, row.untuned = timing, untuned
    row.speedup = untuned.median_s / timing.median_s
    row.status = DepthStatus.MEASURED


def _check_outputs(run: _Run, tuned: Any, plan: Plan) -> str:
    """Why ``tuned``'s outputs do not match eager's ("" when they do)."""
    with torch.no_grad():
        outputs = [run_model(tuned, s, run.call) for s in run.info.samples]
    check = compare_all(run.info.outputs, outputs, _end_to_end_tolerances(plan, run.tolerances))
    return "" if check.ok else check.reason


def _timed(run: _Run, row: DepthRow, tuned: dict[str, Any]) -> dict[str, Timing]:
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


def _end_to_end_tolerances(plan: Plan, given: Tolerances | None) -> Tolerances | None:
    """Tolerances for the whole model's output.

    The caller's, else the loosest of the opt-in backends in the plan (a user who opted into bf16
    accepted its error), else the defaults.
    """
    if given is not None:
        return given
    loose = [t for e in plan.entries if (t := e.backend.tolerances()) is not None]
    if not loose:
        return None
    atol = max(tol.atol for t in loose for tol in t.by_dtype.values())
    rtol = max(tol.rtol for t in loose for tol in t.by_dtype.values())
    return Tolerances.uniform(atol, rtol)


def _select(rows: list[DepthRow], tie_tolerance: float) -> int | None:
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
