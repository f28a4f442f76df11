"""Serve a plan an earlier tune recorded: its runners loaded from the cache and checked, not raced.

A tune records the plan it serves (:class:`RecordedPlan`: the depth, which graph of which
module on which backend, the speed-up it measured). :func:`load_recorded` rebuilds exactly that
plan in another process (or the process that asked a child to tune): the model is inspected
down to the plan's depth on the same calls, each graph of the cut gets the recorded
candidate of its tuning-cache entry (:meth:`tunetree.cache.TuningCache.lookup_recorded`; an
entry whose race the time budget cut short serves too), checked against eager on the samples
and probes like every cached runner, and the whole plan is checked against eager end to end.
Nothing is built, no candidate or depth is measured: the choice was made when it was recorded.

Anything that does not hold (a graph that is not in the cache, another thread count, a graph
the calls no longer make, a runner or output that no longer matches eager) returns None with
the reason logged, and the caller tunes as usual.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from .._util.progress import Progress
from .._util.records import Fields
from ..cache import TuningCache, open_cache
from ..cache.decisions import MAX_PLAN_GRAPHS, PlannedGraph, graph_digest, planned_graphs, same_plan
from ..candidates.budget import END_TO_END_CHECK, Stopwatch, now
from ..candidates.evaluate import CandidateRow, GraphSession, Status
from ..candidates.measure import MeasureConfig
from ..candidates.results import GraphResult
from ..candidates.strategy import Strategy, default_strategy, quick_strategy
from ..errors import TunetreeError
from ..generation import is_generation
from ..runtime.wrap import wrap
from ..signature.inspection import ModelInfo
from ..signature.modules import CallFn
from ..signature.state import check_eval_mode, eval_mode, preserved_state, tensor_placement
from .auto import inspect_timed
from .auto_result import AutoTuneResult, DepthRow, DepthStatus, serve_plan
from .config import UNSET, settings
from .depths import DepthRun
from .endtoend import output_problem
from .tune import check_device, check_untuned, plan_from

log = logging.getLogger(__name__)

NOT_PLANNED = "not in the recorded plan (its module keeps its forward)"
_SETTINGS = ("strategy", "device", "tolerances", "measure_config", "dynamic_shapes")


class RecordedPlanError(TunetreeError):
    """A recorded plan is malformed (read from a file or cache: hostile until checked)."""


@dataclass(frozen=True)
class RecordedPlan:
    """The plan a tune served: its depth, its graphs' backends, the speed-up measured there."""

    depth: int
    graphs: list[PlannedGraph]
    speedup: float | None = None

    @classmethod
    def of(cls, result: AutoTuneResult) -> RecordedPlan | None:
        """The depth plan ``result`` serves, as a record keeps it.

        None where it serves none: untuned, a whole-model runner, an accuracy budget's plan.
        """
        if result.depth is None or not result.plan.entries or result.accuracy is not None:
            return None
        if any(t.chosen for t in result.stateful) or any(t.chosen for t in result.multistep):
            return None
        return cls(result.depth, planned_graphs(result.plan), result.speedup)

    def to_json(self) -> dict[str, Any]:
        """This plan as JSON data."""
        return {
            "depth": self.depth,
            "speedup": self.speedup,
            "graphs": [g.to_json() for g in self.graphs],
        }

    @classmethod
    def from_json(
        cls, data: Any, where: str = "recorded plan", depth: int | None = None
    ) -> RecordedPlan:
        """Read a plan from parsed JSON; ``depth``: the depth it must be of, where one was kept.

        Raises:
            RecordedPlanError: a field is missing, mistyped or out of range (named), or the
                plan is not of ``depth``.
        """
        fields = Fields(data, where, RecordedPlanError)
        kept = depth
        depth = fields.get("depth", int)
        if not 0 <= depth < 1000:
            raise fields.fail("depth", f"is {depth}, not a depth")
        if kept is not None and depth != kept:
            raise fields.fail("depth", f"is {depth}, not the depth kept ({kept})")
        speedup = fields.optional("speedup", float)
        if speedup is not None and not (math.isfinite(speedup) and speedup > 0):
            raise fields.fail("speedup", f"is {speedup}, not a positive number")
        if not 0 < len(fields.get("graphs", list)) <= MAX_PLAN_GRAPHS:
            raise fields.fail("graphs", f"holds no graph or more than {MAX_PLAN_GRAPHS}")
        return cls(depth, fields.items("graphs", PlannedGraph.from_json), speedup)


class _NotRecorded(Exception):
    """A graph of the plan cannot be served from the cache: the plan is given up."""


class _RecordedOnly:
    """The cache as the load asks it: each graph's recorded candidate, else the load stops."""

    def __init__(self, cache: TuningCache, plan: RecordedPlan) -> None:
        self.cache = cache
        self.wanted = {(g.path, g.graph): g.backend for g in plan.graphs}

    def lookup(self, session: GraphSession, strategy: Strategy) -> GraphResult | None:
        backend = self.wanted.get((session.path, graph_digest(session.graph.key)))
        if backend is None:  # the tune served it eagerly: it does so here too
            rows = [CandidateRow(b, Status.SKIPPED, NOT_PLANNED) for b in strategy.backends]
            return GraphResult(session.path, session.graph, rows, None, strategy.describe())
        result = self.cache.lookup_recorded(session, strategy, backend)
        if result is None:
            raise _NotRecorded(
                f"{session.path or '<model>'} {session.graph.key}: its {backend.get('kind')} "
                "runner cannot be served from the cache"
            )
        return result

    def store(self, session: GraphSession, strategy: Strategy, result: GraphResult) -> None:
        """Never called: a lookup here never misses (it raises instead)."""


def load_recorded(
    model: Any,
    dataset: Any,
    plan: RecordedPlan,
    *,
    cache: Any,
    call: CallFn | None = None,
    options: dict[str, Any] | None = None,
) -> AutoTuneResult | None:
    """``model`` served by ``plan``'s runners from ``cache``, checked against eager; or None.

    Args:
        model: the model the plan was tuned for (a copy the caller owns: a plan below the
            root is wrapped into it).
        dataset: the calls it was tuned on (their graphs key the cache's entries).
        plan: the plan to serve.
        cache: the tuning cache (a :class:`tunetree.TuningCache`, or what ``cache=`` takes).
        call: ``call(model, *args, **kwargs)`` runs one item, as in ``auto_tune``.
        options: the ``auto_tune`` keywords the plan was tuned with (strategy, device,
            tolerances, measure_config, dynamic_shapes, quick, ...; the others are unused).

    Returns:
        The result serving the plan (its speed-up is the one recorded), or None when the plan
        cannot be served here (the reason is logged).
    """
    opts = dict(options or {})
    if opts.get("accuracy") is not None or opts.get("dry_run"):
        return _given_up(plan, "an accuracy budget or a dry run tunes as usual")
    graph_cache = open_cache(cache)
    if not isinstance(graph_cache, TuningCache):
        return _given_up(plan, "there is no tuning cache to load it from")
    cfg = settings(
        opts.get("config"),
        call=call if call is not None else UNSET,
        cache=graph_cache,
        verbose=False,
        **{k: opts.get(k, UNSET) for k in _SETTINGS},
    )
    start, clock = now(), Stopwatch()
    check_untuned(model)
    if not cfg.allow_training:
        check_eval_mode(model)
    dev = check_device(model, cfg.device)
    quick = bool(opts.get("quick"))
    progress = Progress(cfg.verbose)
    with preserved_state(model), eval_mode(model):
        info, _ = inspect_timed(
            model, dataset, cfg, dev, clock, progress, plan.depth, warm_up=False
        )
        if info.max_depth < plan.depth:
            return _given_up(plan, f"the model's deepest executed depth is {info.max_depth}")
        strategy = cfg.strategy or (quick_strategy(dev) if quick else default_strategy(dev))
        run = DepthRun(
            model=model,
            info=info,
            call=cfg.call,
            config=cfg.measure_config or (MeasureConfig.first_look() if quick else MeasureConfig()),
            strategy=strategy,
            tolerances=cfg.tolerances,
            progress=progress,
            cache=graph_cache,
            devices=tensor_placement(model),
            deadline=None,
            clock=clock,
            generation=is_generation(info, model),
        )
        results: list[GraphResult] = []
        try:
            results = run.tune_cut(plan.depth, _RecordedOnly(graph_cache, plan))
            served = plan_from(results, plan.depth)
            problem = "the cache's runners do not make the recorded plan"
            if served.runners() and same_plan(plan.graphs, served):
                repeats = checked_whole(model, info, cfg.call, results)
                if repeats:
                    problem = ""
                    log.debug("recorded plan: no end-to-end check: %s", repeats)
                else:
                    tuned = wrap(model, served.runners(), in_place=False)
                    with clock.phase(END_TO_END_CHECK):
                        problem = output_problem(info, cfg.call, tuned, served, cfg.tolerances)
                    problem = problem and f"end-to-end output: {problem}"
        except _NotRecorded as exc:
            problem = str(exc)
        finally:
            run.restore()
        if problem:
            for graph in results:  # no loaded runner outlives a plan given up
                graph.release_runners(keep=())
            return _given_up(plan, problem)
        summary = info.summary(plan.depth)
        row = DepthRow(plan.depth, summary.modules, summary.graphs, DepthStatus.RECORDED)
        row.speedup = plan.speedup
        return AutoTuneResult(
            serve_plan(model, served, plan.depth),
            plan.depth,
            [row],
            None,
            plan=served,
            graphs={plan.depth: results},
            info=info,
            original=model,
            plans={plan.depth: served},
            tuning_s=now() - start,
            breakdown=clock.breakdown(),
            decision=(
                f"the plan of depth {plan.depth} was recorded by an earlier tune"
                + (f" ({plan.speedup:.2f}x there)" if plan.speedup else "")
                + ": loaded from the tuning cache and checked against eager here, not measured"
            ),
        )


def checked_whole(
    model: Any, info: ModelInfo, call: CallFn | None, results: list[GraphResult]
) -> str:
    """Why the graph check already was the end-to-end check ("" when it was not).

    It was when the plan is one runner for the whole model, called as the model (no ``call``,
    no hook of the root's or global forward hook between the runner and the caller), whose
    check ran on every inspected call (its samples are all of them, none holding state) and
    whose outputs were compared with eager's of those calls at the end-to-end check's
    tolerances (the caller's, else the defaults): a backend with tolerances of its own (bf16)
    is checked again.
    """
    if call is not None or not info.root_called or not isinstance(model, nn.Module):
        return ""
    if len(results) != 1 or results[0].path != "" or results[0].winner is None:
        return ""
    graph = results[0].graph
    if results[0].winner.backend.tolerances() is not None:
        return ""  # checked with its own tolerances, end to end with the caller's
    if len(graph.samples) != len(info.samples) or any(s.stateful for s in info.samples):
        return ""
    if _forward_hooks(model):
        return ""
    return (
        "the plan is one runner for the whole model, already checked against eager on every "
        f"one of the {len(info.samples)} calls"
    )


def _forward_hooks(module: nn.Module) -> bool:
    """Whether a forward hook (the module's or a global one) sees the root's output."""
    from torch.nn.modules import module as torch_module

    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
    )


def _given_up(plan: RecordedPlan, reason: str) -> AutoTuneResult | None:
    """Log why ``plan`` is not served; None, for the caller to return."""
    log.info("recorded plan of depth %d not served: %s", plan.depth, reason)
    return None
