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
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .._util.progress import Progress
from ..accuracy.budget import AccuracyBudget
from ..cache import open_cache
from ..candidates.budget import (
    END_TO_END,
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
from ..generation import is_generation
from ..generation.multistep_trial import MultiStepTrial
from ..generation.stateful_trial import StatefulTrial
from ..runtime.plan import Plan
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
from .auto_result import AutoTuneResult, DepthRow, DepthStatus, measured_plan_at, serve_plan
from .config import UNSET, TuneConfig, Unset, settings
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
from .multistep_first import applies as multistep_applies
from .multistep_first import multistep_first
from .rival import WHOLE_MODEL, FinalCheck, FinalRun, final_check, whole_model_plan
from .stateful_first import applies, stateful_first
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
GPU_INSPECTION_PASSES = 10.0
"""Root passes the inspection down to the deepest depth is expected to take on a GPU: about
9.5 for ``generate`` of a 0.6B model in bf16 (host-bound, every module's calls recorded)."""


@dataclass(frozen=True)
class _DepthSearch:
    """What only :func:`auto_tune` takes: the depths, how they are compared, its budgets."""

    min_depth: int
    max_depth: int | None
    tie_tolerance: float
    budget_s: float | None
    quick: bool
    accuracy: AccuracyBudget | None
    reuse_decision: bool
    savable: bool


def auto_tune(
    model: Any,
    dataset: Iterable[Any],
    *,
    min_depth: int = 0,
    max_depth: int | None = None,
    tie_tolerance: float = 0.02,
    time_budget: float | Literal["default"] | None = "default",
    quick: bool = False,
    accuracy: AccuracyBudget | None = None,
    reuse_decision: bool = True,
    savable: bool = False,
    config: TuneConfig | None = None,
    strategy: Strategy | Unset | None = UNSET,
    device: torch.device | str | Unset | None = UNSET,
    dry_run: bool | Unset = UNSET,
    call: CallFn | Unset | None = UNSET,
    tolerances: Tolerances | Unset | None = UNSET,
    measure_config: MeasureConfig | Unset | None = UNSET,
    verbose: bool | Unset = UNSET,
    cache: GraphCache | str | os.PathLike[str] | bool | Unset | None = UNSET,
    dynamic_shapes: DynamicShapes | Unset = UNSET,
    allow_training: bool | Unset = UNSET,
) -> AutoTuneResult:
    """Tune every distinct cut from ``min_depth`` to ``max_depth`` and keep the fastest depth.

    Each depth is measured end to end side by side with the untuned model on ``dataset``; the
    best speed-up wins (the shallowest within ``tie_tolerance``), or the untuned model when no
    depth beats it. A graph tuned at one depth is reused at every other depth that wraps the
    same module with the same graph, and a plan already measured is not measured again.
    ``print(result)`` and ``result.timing()`` show where the time went, by phase. The model's
    buffers, parameters and the RNG state are never changed.

    Args:
        model: An ``nn.Module`` in eval mode, or a pipeline, as in :func:`tunetree.tune`.
        dataset: What the model is called with, one item per call.
        min_depth: The shallowest cut tried.
        max_depth: The deepest cut tried (None: :data:`MAX_DEFAULT_DEPTH`, or
            :data:`QUICK_MAX_DEPTH` with ``quick``).
        tie_tolerance: Speed-ups within this fraction of the best count as a tie, won by the
            shallowest depth.
        time_budget: Seconds from the call, held within about 10 % (``"default"``:
            :data:`DEFAULT_TIME_BUDGET_S`, or :data:`QUICK_TIME_BUDGET_S` with ``quick``;
            None: unlimited). No depth, graph, build or measurement is started that is
            expected to cross it (nor ``generate``'s whole-model trial, whose rows then say
            so), up to a quarter of it is kept for the end-to-end
            measurement of the depth in progress, and the skipped work is marked "time budget
            used up" (``result.skipped()``); eager is always there.
        quick: A first look: only backends that build quickly
            (:func:`tunetree.quick_strategy`, when ``strategy`` is None), shallow depths,
            :meth:`MeasureConfig.first_look` (when ``measure_config`` is None), a 60 s budget.
        accuracy: Opt into results that change (a :class:`tunetree.AccuracyBudget`):
            reduced-precision candidates (:func:`tunetree.accuracy_strategy`, when
            ``strategy`` is None) are admitted by their measured error, and each depth's plan
            is checked end to end, also on a held-out share of ``dataset``, and repaired until
            it holds the budget (``result.pareto()`` shows latency against error).
        reuse_decision: Record the depth chosen in the tuning cache; a later call with the
            same key whose plan comes whole from the cache checks it against eager and
            measures it once beside the untuned model, no other depth. False: measure all.
        savable: Every result :func:`tunetree.save` writes now, ``generate``'s whole model
            as one stateful runner included (re-exported and checked at load); True still
            skips that runner so that the result is a depth plan of per-graph runners (for
            callers that inspect or check such a plan).
        config: The settings below as one :class:`tunetree.TuneConfig`; a keyword given
            beside it must agree with it.
        strategy: The candidates per graph (None: :func:`tunetree.default_strategy` for the
            device); every graph gets its own copy.
        device: Where to tune (None: where the model's weights are).
        dry_run: Report what each depth would wrap; tune nothing.
        call: ``call(model, *args, **kwargs)`` runs one item (None: ``model(...)``).
        tolerances: How close to eager a candidate's outputs must be (None: the defaults).
        measure_config: How candidates are timed (None: :class:`tunetree.MeasureConfig`).
        verbose: Progress on the ``tunetree.progress`` logger at INFO (else DEBUG).
        cache: The tuning cache consulted per graph, as in :func:`tunetree.tune`.
        dynamic_shapes: As in :func:`tunetree.tune`; every depth is measured on the same
            mix of recorded shapes.
        allow_training: Tune a model in training mode (its eval behaviour); refused otherwise.

    Returns:
        An :class:`tunetree.AutoTuneResult`: call ``result.model``; ``print(result)`` shows
        every depth.

    Raises:
        InvalidInputError: Depths or ``tie_tolerance`` out of range, no depth to try, a negative
            ``time_budget``, or as :func:`tunetree.tune` does.
        CacheError: As :func:`tunetree.tune`.

    Example:
        >>> import torch, tunetree as tt
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        >>> result = tt.auto_tune(model, [torch.randn(2, 8)], dry_run=True, cache=False,
        ...     verbose=False)
        >>> [(row.depth, row.modules, row.graphs) for row in result.rows]
        [(0, 1, 1), (1, 2, 2)]
    """
    cfg = settings(
        config,
        strategy=strategy,
        device=device,
        dry_run=dry_run,
        call=call,
        tolerances=tolerances,
        measure_config=measure_config,
        verbose=verbose,
        cache=cache,
        dynamic_shapes=dynamic_shapes,
        allow_training=allow_training,
    )
    _check_arguments(min_depth, max_depth, tie_tolerance)
    if quick and max_depth is None:
        max_depth = max(min_depth, QUICK_MAX_DEPTH)
    search = _DepthSearch(
        min_depth,
        max_depth,
        tie_tolerance,
        budget_seconds(time_budget, quick),
        quick,
        accuracy,
        reuse_decision,
        savable,
    )
    return _auto_tune(model, dataset, cfg, search)


def _auto_tune(
    model: Any, dataset: Iterable[Any], cfg: TuneConfig, search: _DepthSearch
) -> AutoTuneResult:
    """:func:`auto_tune` with its settings resolved."""
    start = now()
    clock = Stopwatch()
    check_untuned(model)
    if not cfg.allow_training:
        check_eval_mode(model)
    dev = check_device(model, cfg.device)
    progress = Progress(cfg.verbose)
    held: list[Any] = []
    if search.accuracy is not None:
        dataset, held = search.accuracy.split(list(dataset))
    with preserved_state(model), eval_mode(model):
        strategy = cfg.strategy or _strategy(dev, search.quick, search.accuracy)  # built once
        whole, info, run, trials, tried = _whole_model_first(
            model, dataset, held, cfg, search, strategy, dev, clock, progress, start
        )
        if whole is not None:
            return whole
        rows = _checked_rows(info, search)
        if cfg.dry_run:
            for row in rows:
                row.status = DepthStatus.DRY_RUN
            return AutoTuneResult(model, None, rows, None, info=info, dry_run=True, original=model)
        if run is None:
            run = _depth_run(model, info, cfg, search, strategy, progress, clock, start)
        with clock.phase(SETUP):
            nothing = _nothing_to_try(run.strategy, dev)
            if nothing:
                log.warning("auto_tune leaves the model untuned: %s", nothing)
                for row in rows:
                    row.status, row.error = DepthStatus.SKIPPED, nothing
                return AutoTuneResult(
                    model, None, rows, None, info=info, original=model, tuning_s=now() - start
                )
            if search.accuracy is not None:
                progress("accuracy budget: eager's references for the held-out inputs")
                run.accuracy = EndToEndCheck.prepare(search.accuracy, model, info, held, cfg.call)
        looped, multistep = (
            (None, tried or [])
            if search.savable or cfg.dry_run or tried is not None
            else multistep_first(run, rows, held, dev, search.budget_s, start)
        )
        if looped is not None:
            return looped
        decisions = DepthDecisions.open(run, rows, search.tie_tolerance, search.reuse_decision)
        before = decisions.try_reuse()
        if before is None:
            before = _search(run, rows, search.budget_s)
        # measures: still in eval mode
        result = _finish(run, rows, before, search, start, decisions.note(), trials, multistep)
    decisions.record(result)
    return result


def _checked_rows(info: ModelInfo, search: _DepthSearch) -> list[DepthRow]:
    """The depth rows to try; InvalidInputError when there is none."""
    rows = _depth_rows(info, search.min_depth, search.max_depth)
    if not rows:
        fused = f"; {info.fast_path_note()}" if info.fused else ""
        raise InvalidInputError(
            f"no depth to try: min_depth={search.min_depth} is deeper than the model's "
            f"deepest executed module (depth {info.max_depth}){fused}"
        )
    if info.fused:
        log.warning("auto_tune: %s", info.fast_path_note())
    return rows


def _whole_model_first(
    model: Any,
    dataset: Any,
    held: list[Any],
    cfg: TuneConfig,
    search: _DepthSearch,
    strategy: Strategy,
    dev: torch.device,
    clock: Stopwatch,
    progress: Progress,
    start: float,
) -> tuple[
    AutoTuneResult | None,
    ModelInfo,
    DepthRun | None,
    list[StatefulTrial],
    list[MultiStepTrial] | None,
]:
    """The whole-model trial where it comes first, and the inspection the rest needs.

    The CPU's stateful runner (:mod:`.stateful_first`) or the GPU's multi-step decode loop
    (:mod:`.multistep_first`). Returns the result when the trial won (nothing deeper was
    inspected) or when less of the budget is left than the root's inspection took (the
    untuned model, every depth skipped), else None and the model inspected down to the
    deepest depth tried; then the run when the trial made one, the stateful trial's rows,
    and the multi-step trial's (None when it was not tried here).
    """
    deepest = MAX_DEFAULT_DEPTH if search.max_depth is None else search.max_depth
    first = _whole_first(model, cfg, search, strategy, dev)
    # The trial needs the root's calls only: deeper depths are inspected after it, and only
    # when it did not win.
    info, pass_s = inspect_timed(model, dataset, cfg, dev, clock, progress, 0 if first else deepest)
    if not first:
        return None, info, None, [], None
    run = _depth_run(model, info, cfg, search, strategy, progress, clock, start)
    rows = _depth_rows(info, search.min_depth, search.max_depth)
    trials: list[StatefulTrial] = []
    looped: list[MultiStepTrial] | None = None
    if dev.type == "cuda":
        whole, looped = multistep_first(run, rows, held, dev, search.budget_s, start)
    else:
        whole, trials = stateful_first(
            run, rows, held, search.accuracy, search.budget_s, start, pass_s
        )
    if whole is not None:
        return whole, info, run, trials, looped
    if run.deadline is not None and run.deadline.left_s() < _inspection_s(pass_s, dev):
        # Less left than the depths' inspection is expected to take: no depth could be
        # inspected, let alone measured end to end beside the untuned model. The model
        # stays untuned.
        progress("the time budget is used up: no depth is inspected or tuned")
        for row in rows:
            row.status, row.error = DepthStatus.SKIPPED, TIME_BUDGET_ERROR
        spent = AutoTuneResult(
            model,
            None,
            rows,
            None,
            info=info,
            original=model,
            stateful=trials,
            multistep=looped or [],
            tuning_s=now() - start,
            breakdown=clock.breakdown(),
            time_budget=search.budget_s,
            accuracy=search.accuracy,
        )
        return spent, info, run, trials, looped
    info, _ = inspect_timed(model, dataset, cfg, dev, clock, progress, deepest)
    run.info, run.generation = info, is_generation(info, model)
    return None, info, run, trials, looped


def _inspection_s(pass_s: float, dev: torch.device) -> float:
    """Seconds the depths' inspection is expected to take after a whole-model trial.

    ``pass_s``: the root's inspection (one pass over the calls). On a GPU, where a small
    model's ``generate`` is bound by the host, recording every module's calls costs
    :data:`GPU_INSPECTION_PASSES` passes; on the CPU one pass is kept.
    """
    return pass_s * (GPU_INSPECTION_PASSES if dev.type == "cuda" else 1.0)


def _whole_first(
    model: Any, cfg: TuneConfig, search: _DepthSearch, strategy: Strategy, dev: torch.device
) -> bool:
    """Whether a whole-model trial comes before the depths' inspection.

    The CPU's stateful runner or the GPU's multi-step decode loop, where it may serve the
    model; not for a dry run, a savable-only search, or a search that starts below the root.
    """
    if cfg.dry_run or search.savable or search.min_depth != 0:
        return False
    kinds = [b.kind for b in strategy.backends]
    return applies(model, kinds, dev) or multistep_applies(model, kinds, dev)


def _depth_run(
    model: Any,
    info: ModelInfo,
    cfg: TuneConfig,
    search: _DepthSearch,
    strategy: Strategy,
    progress: Progress,
    clock: Stopwatch,
    start: float,
) -> DepthRun:
    """What the whole-model trial and the depths share."""
    with clock.phase(SETUP):
        return DepthRun(
            model=model,
            info=info,
            call=cfg.call,
            config=cfg.measure_config
            or (MeasureConfig.first_look() if search.quick else MeasureConfig()),
            strategy=strategy,
            tolerances=cfg.tolerances,
            progress=progress,
            cache=open_cache(cfg.cache),
            devices=tensor_placement(model),
            deadline=_deadline(search.budget_s, start),
            clock=clock,
            generation=is_generation(info, model),
        )


def _deadline(budget_s: float | None, start: float) -> Deadline | None:
    return None if budget_s is None else Deadline.after(budget_s, start)


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


def budget_seconds(time_budget: float | Literal["default"] | None, quick: bool) -> float | None:
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
    run: DepthRun,
    rows: list[DepthRow],
    before: Timing,
    search: _DepthSearch,
    start: float,
    decision: str,
    stateful: list[StatefulTrial],
    multistep: list[MultiStepTrial],
) -> AutoTuneResult:
    """Pick the depth, wrap the model with its plan, and return the whole result.

    ``untuned_after`` is the untuned timing taken beside the last measured depth;
    ``stateful`` the whole-model stateful runner's rows, tried first (none chosen).
    """
    measured = [r for r in rows if r.untuned is not None and r.same_as is None]
    after = measured[-1].untuned if measured else None
    untuned = min((t for t in (before, after) if t is not None), key=lambda t: t.median_s)
    against_fastest_untuned(measured, before)
    selected = select_depth(rows, search.tie_tolerance)
    final = _final_check(run, rows, selected, search.tie_tolerance, before)
    if final is not None and final.kept_rival:  # depth 0 now holds the rival, timed again
        selected = 0
        against_fastest_untuned([r for r in rows if r.untuned and r.same_as is None], before)
    if run.accuracy is not None:
        for depth, measured_plan in run.plans.items():
            measured_plan.accuracy = accuracy_record(
                run.accuracy.budget, next(r for r in rows if r.depth == depth)
            )
    model, plan = run.model, Plan()
    if selected is not None:
        plan = measured_plan_at(run.plans, selected)
        model = serve_plan(run.model, plan, selected)
    release_unplanned(run.graphs.values(), run.plans.values())  # result.use picks among those
    return AutoTuneResult(
        model,
        selected,
        rows,
        untuned,
        before,
        after,
        plan=plan,
        graphs=run.graphs,
        info=run.info,
        original=run.model,
        plans=dict(run.plans),
        final="" if final is None else str(final),
        tuning_s=now() - start,
        breakdown=run.clock.breakdown(),
        time_budget=search.budget_s,
        accuracy=search.accuracy,
        decision=decision,
        stateful=stateful,
        multistep=multistep,
    )


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


def inspect_timed(
    model: Any,
    dataset: Any,
    cfg: TuneConfig,
    dev: torch.device,
    clock: Stopwatch,
    progress: Progress,
    depth: int,
    warm_up: bool = True,
) -> tuple[ModelInfo, float]:
    """The model inspected down to ``depth``, and how long that took (one pass of its calls).

    ``warm_up``: as :func:`tunetree.inspect`'s (False: no untimed first call where nothing
    needs it, for a caller that measures nothing).
    """
    progress("inspecting the model" if depth else "inspecting the model's root")
    started = now()
    with clock.phase(INSPECTION):
        info = inspect(
            model,
            dataset,
            call=cfg.call,
            device=dev,
            dynamic_shapes=cfg.dynamic_shapes,
            max_depth=depth,
            warm_up=warm_up,
        )
    return info, now() - started
