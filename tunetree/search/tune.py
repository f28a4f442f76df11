"""tune(): wrap one cut of a model with the best candidate per graph."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from .._util.progress import Progress
from .._util.table import format_seconds, format_table
from ..accuracy import AccuracyBudget
from ..backends.base import Backend
from ..backends.compile_pool import compile_pool_closed
from ..cache import TuningCache, open_cache
from ..cache.keys import structure_digest
from ..candidates.budget import (
    CACHE,
    END_TO_END_CHECK,
    INSPECTION,
    TIME_BUDGET_ERROR,
    Deadline,
    Stopwatch,
    TimeBreakdown,
)
from ..candidates.build_costs import module_size
from ..candidates.evaluate import CandidateRow, GraphSession, Status
from ..candidates.measure import MeasureConfig
from ..candidates.results import GraphCache, GraphResult
from ..candidates.strategy import Strategy, default_strategy
from ..errors import InvalidInputError
from ..generation import by_time_share, is_generation
from ..runtime.plan import Plan, PlanEntry
from ..runtime.wrap import unwrap, wrap, wrapped_paths
from ..signature.compare import Tolerances
from ..signature.inspection import ModelInfo, inspect
from ..signature.modules import CallFn, find_module, resolve_device
from ..signature.shapes import DynamicShapes
from ..signature.state import check_eval_mode, eval_mode, preserved_state
from .config import UNSET, TuneConfig, Unset, settings
from .serving import mark_unserved, serve_once

log = logging.getLogger(__name__)


@dataclass
class TuneResult:
    """What :func:`tune` did; ``print()`` it for every candidate of every graph.

    Attributes:
        model: The thing to call (tuned; the model itself where nothing was wrapped).
        depth: The cut that was tuned.
        plan: The winner of each graph, as :func:`tunetree.save` records it.
        graphs: Each graph's candidates and winner.
        info: The :func:`tunetree.inspect` result the tune worked from.
        dry_run: Nothing was tuned, only reported.
        original: The model given in; :meth:`undo` unwraps it.
        breakdown: Where the tuning time went, by phase (None for a dry run).

    Example:
        >>> import torch, tunetree as tt
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        >>> result = tt.tune(model, [torch.randn(2, 8)], depth=1, dry_run=True, cache=False,
        ...     verbose=False)
        >>> print(result)
        Dry run at depth 1: would tune 2 modules, 2 graphs (...% of eager time). Nothing was tuned.
    """

    model: Any
    depth: int
    plan: Plan
    graphs: list[GraphResult]
    info: ModelInfo = field(repr=False)
    dry_run: bool = False
    original: Any = field(default=None, repr=False)
    breakdown: TimeBreakdown | None = None

    def timing(self) -> str:
        """The tuning time by phase as a table (see :class:`tunetree.TimeBreakdown`)."""
        return str(self.breakdown) if self.breakdown is not None else "nothing was timed"

    def undo(self) -> Any:
        """Remove every wrap this tune installed; returns the untuned model."""
        unwrap(self.original)
        return self.original

    def table(self) -> str:
        """Every candidate of every graph as a table; the winner's backend is marked with ``*``.

        Columns: module, graph, backend, status, latency, speed-up over eager, build time, the
        largest absolute difference from eager and, under an accuracy budget, the error in its
        module metric.
        """
        rows = []
        with_error = any(r.error is not None for g in self.graphs for r in g.rows)
        for g in self.graphs:
            eager = g.eager_latency_s
            for row in g.rows:
                mark = "*" if row is g.winner else ""
                ratio = (
                    f"{eager / row.latency_s:.2f}x"
                    if eager and row.latency_s and row.timing is not None and not g.never_served
                    else "-"
                )
                status = row.describe()
                if g.never_served and row is g.winner:
                    status += " (never served: no call was keyed like this graph)"
                rows.append(
                    [
                        (g.path or "<model>") + (" (cached)" if g.cached else ""),
                        str(g.graph.key),
                        mark + row.backend.name,
                        status,
                        row.latency_text(),
                        ratio,
                        format_seconds(row.build_s),
                        "-" if row.max_abs_diff is None else f"{row.max_abs_diff:.2g}",
                    ]
                    + ([] if not with_error else ["-" if row.error is None else f"{row.error:.2g}"])
                )
        headers = ["module", "graph", "backend", "status", "latency", "vs eager", "build"]
        return format_table(headers + ["max diff"] + (["error"] if with_error else []), rows)

    def shapes(self) -> str:
        """Per recorded shape, the latency of each ranged graph's winner and of eager."""
        return "\n\n".join(t for g in self.graphs if (t := g.per_shape_table()))

    def __str__(self) -> str:
        if self.dry_run:
            s = self.info.summary(self.depth)
            return (
                f"Dry run at depth {self.depth}: would tune {s.modules} modules, "
                f"{s.graphs} graphs ({100 * s.time_share:.1f}% of eager time). Nothing was tuned."
            )
        chosen = sum(1 for g in self.graphs if g.winner is not None)
        head = (
            f"Tuned depth {self.depth}: {len(self.graphs)} graphs in "
            f"{len({g.path for g in self.graphs})} modules, {chosen} with a usable candidate "
            "(* = winner)"
        )
        note = self.info.coverage_note()
        timing = f"\n{self.breakdown}" if self.breakdown is not None else ""
        return head + "\n" + self.table() + (f"\nNote: {note}" if note else "") + timing


GraphMemo = dict[tuple[str, Any], GraphResult]
"""Graphs already tuned, by (path, graph key): reused instead of tuned twice."""


@compile_pool_closed()
def tune_cut(
    model: Any,
    info: ModelInfo,
    depth: int,
    *,
    strategy: Strategy | None,
    tolerances: Tolerances,
    measure_config: MeasureConfig,
    progress: Progress,
    memo: GraphMemo | None = None,
    on_build: Callable[[Backend], None] | None = None,
    cache: GraphCache | None = None,
    deadline: Deadline | None = None,
    clock: Stopwatch | None = None,
    accuracy: AccuracyBudget | None = None,
    most_time_first: bool = False,
) -> list[GraphResult]:
    """Run the strategy on every graph of every module in the cut at ``depth``.

    The model must be unwrapped; nothing is wrapped here. Once ``deadline`` has no time left but
    its reserve, graphs not started are skipped (their modules keep their forward); started
    graphs build no candidate expected to cross it but eager. ``clock`` is charged the builds,
    checks, measurements and cache look-ups. ``accuracy`` admits results-changing candidates
    by their error (see :attr:`GraphSession.accuracy`). ``most_time_first`` tunes the graphs
    in order of their share of eager time (a ``generate`` call's decode graph first, see
    :func:`tunetree.generation.by_time_share`); results keep the cut's order. A compile thread
    pool Inductor made meanwhile is shut down when it returns or raises, its queued work
    cancelled (:mod:`tunetree.backends.compile_pool`): none outlives the tuning.
    """
    base = strategy or default_strategy(info.device)
    clock = clock or Stopwatch()
    todo = [(p, k, g) for p in info.cut(depth) for k, g in info.modules[p].graphs.items()]
    order = by_time_share(todo) if most_time_first else list(range(len(todo)))
    paths = {p for p, _, _ in todo}
    digests = {p: structure_digest(find_module(model, p)) for p in paths}
    sizes = {p: module_size(find_module(model, p)) for p in paths}
    ordered = [todo[i] for i in order]
    full = _tuned_in_full(ordered, digests, memo)
    own = _own_graphs(full)
    parts = _time_parts(ordered, full) if most_time_first else [None] * len(ordered)
    found: dict[int, GraphResult] = {}
    twins: dict[tuple[str, Any], GraphResult] = {}
    started = time.perf_counter()
    for done, index in enumerate(order):
        path, key, graph = todo[index]
        where = path or "<model>"
        if memo is not None and (path, key) in memo:
            progress(f"depth {depth}", where, graph, "reused")
            found[index] = memo[(path, key)]
            continue
        if deadline is not None and deadline.free_s() <= 0:
            rows = [CandidateRow(b, Status.SKIPPED, TIME_BUDGET_ERROR) for b in base.backends]
            found[index] = GraphResult(path, graph, rows, None, base.describe())
            progress(f"depth {depth}", where, graph, f"skipped: {TIME_BUDGET_ERROR}")
            continue
        session = GraphSession(
            find_module(model, path),
            path,
            graph,
            info.device,
            tolerances,
            measure_config,
            progress,
            on_build,
            deadline=deadline,
            clock=clock,
            call_s=_graph_call_s(info, path, graph),
            accuracy=accuracy,
        )
        window = (
            deadline.graph_window(
                own[done],
                parts[done],
                _firsts_after_s(deadline, base, measure_config, info, sizes, ordered, full, done),
            )
            if deadline is not None
            else nullcontext()
        )
        with window:
            result = _tune_graph(session, base, cache, twins, digests[path])
        if deadline is not None:
            _record_race(deadline, result)
        if memo is not None and not result.cut_short:
            memo[(path, key)] = result
        found[index] = result
        winner = result.winner.backend.name if result.winner else "none (keeps its forward)"
        progress(f"depth {depth}", where, graph, f"winner: {winner}", _eta(started, done, todo))
    return [found[i] for i in sorted(found)]


def _tuned_in_full(
    todo: list[tuple[str, Any, Any]], digests: dict[str, str], memo: GraphMemo | None
) -> list[bool]:
    """For each graph of ``todo``, whether it is tuned in full (takes a share of the budget).

    A graph reused from another depth (``memo``) costs nothing, and neither does a twin of one
    before it (same structure, same graph): it races only that one's winner.
    """
    seen: set[tuple[str, Any]] = set()
    full = []
    for path, key, _ in todo:
        twin = (digests[path], key)
        full.append(not (memo is not None and (path, key) in memo) and twin not in seen)
        seen.add(twin)
    return full


def _own_graphs(full: list[bool]) -> list[int]:
    """For each graph, how many from it on are tuned in full: its budget share.

    ``full`` as :func:`_tuned_in_full` gives it.
    """
    return [sum(full[i:]) for i in range(len(full))]


def _firsts_after_s(
    deadline: Deadline,
    base: Strategy,
    measure_config: MeasureConfig,
    info: ModelInfo,
    sizes: dict[str, int],
    ordered: list[tuple[str, Any, Any]],
    full: list[bool],
    done: int,
) -> float:
    """What the first candidates of the graphs tuned in full after ``done`` are expected to take.

    Per graph, the cheapest expected build of the strategy's backends besides eager (at that
    graph's size) and the short measurement of that candidate beside eager: the graph in
    progress keeps that much free for them once it has a candidate. ``full`` as
    :func:`_tuned_in_full` gives it.
    """
    others = [b for b in base.backends if b.kind != "eager"]
    if not others:
        return 0.0
    screening = measure_config.screening()
    total = 0.0
    for (path, _, graph), tuned in zip(ordered[done + 1 :], full[done + 1 :], strict=True):
        if tuned:
            size = sizes[path]
            total += min(deadline.expected_build_s(b.name, size, b.build_prior_s()) for b in others)
            call_s = _graph_call_s(info, path, graph)
            total += screening.least_s(2, call_s, max(1, len(graph.samples)))
    return total


def _graph_call_s(info: ModelInfo, path: str, graph: Any) -> float:
    """About one eager call of ``graph``: from its own inspection timings, else its module's."""
    return graph.total_s / graph.calls if graph.calls else _call_s(info, path)


def _time_parts(todo: list[tuple[str, Any, Any]], full: list[bool]) -> list[float | None]:
    """Each graph's part of the eager time of the graphs tuned in full from it on.

    ``full`` says which those are, as :func:`_tuned_in_full` gives it. None (an equal share)
    where the graph is not tuned in full or nothing was timed.
    """
    parts: list[float | None] = []
    for i, (_, _, graph) in enumerate(todo):
        left = sum(g.total_s for (_, _, g), f in zip(todo[i:], full[i:], strict=True) if f)
        parts.append(graph.total_s / left if full[i] and left > 0 else None)
    return parts


def _record_race(deadline: Deadline, result: GraphResult) -> None:
    """Tell the deadline's build costs which candidates were correct and which one won."""
    raced = [r.backend.name for r in result.rows if r.usable and r.backend.kind != "eager"]
    winner = result.winner.backend if result.winner is not None else None
    won = winner.name if winner is not None and winner.kind != "eager" else None
    deadline.costs.record_race(raced, won)


def _call_s(info: ModelInfo, path: str) -> float:
    """Seconds per eager call of the module at ``path``, as the inspection saw them."""
    record = info.modules[path]
    return record.total_s / record.calls if record.calls else 0.0


def _tune_graph(
    session: GraphSession,
    base: Strategy,
    cache: GraphCache | None,
    twins: dict[tuple[str, Any], GraphResult],
    digest: str,
) -> GraphResult:
    """One graph: the cached result, else the strategy's (stored unless the budget cut it).

    A graph whose twin (a module of the same structure called with the same graph, see
    :func:`~tunetree.cache.keys.structure_digest`) was tuned before in this cut races what
    :meth:`Strategy.for_twin` leaves: usually the twin's winner against eager, measured with
    :meth:`MeasureConfig.confirming`.
    """
    twin_key = (digest, session.graph.key)
    twin = twins.get(twin_key)
    narrowed = base.for_twin(_twin_winners(twin)) if twin and twin.winner else None
    if narrowed is not None:
        assert twin is not None and twin.winner is not None
        confirming = dataclasses.replace(
            session, measure_config=session.measure_config.confirming()
        )
        result = _tune_with(confirming, narrowed, cache)
        note = f"not built: twin of {twin.path or '<model>'}, where {twin.winner.backend.name} won"
        result.rows += [
            CandidateRow(b, Status.SKIPPED, note)
            for b in base.backends
            if b not in narrowed.backends
        ]
        cached = " (cached)" if result.strategy.endswith("(cached)") else ""
        result.strategy = f"{base.describe()} (twin of {twin.path or '<model>'}){cached}"
        return result
    result = _tune_with(session, base, cache)
    if result.winner is not None and not result.cut_short:
        twins.setdefault(twin_key, result)
    return result


def _twin_winners(twin: GraphResult) -> list[Backend]:
    """The backends a twin's race keeps: the twin's winner, and its fallback.

    The fallback, when the winner changes results, is the twin's fastest usable results-keeping
    candidate other than eager: what an accuracy budget's repair returns to.
    """
    assert twin.winner is not None
    winners = [twin.winner.backend]
    fallback = twin.fastest_keeping()
    if not twin.winner.backend.preserves_results and fallback is not None:
        winners.append(fallback.backend)
    return winners


def _tune_with(session: GraphSession, base: Strategy, cache: GraphCache | None) -> GraphResult:
    """The cached result for ``base``, else a fresh run of it (stored unless the budget cut it)."""
    own = base.copy()
    if cache is not None:
        with session.clock.phase(CACHE):
            cached = cache.lookup(session, own)
        if cached is not None:
            session.graph.checks = None  # the hit's probe check is done; probes can be large
            return cached
    outcome = own.run(session)
    result = GraphResult(session.path, session.graph, outcome.rows, outcome.winner, own.describe())
    _measure_shapes(session, result)
    session.graph.checks = None  # probe outputs can be large; the graph is tuned once
    if cache is not None and (not result.cut_short or isinstance(cache, TuningCache)):
        # A race the budget cut short is kept only where the cache marks it partial: a later
        # process loading the plan that chose it needs it, and no lookup takes it for whole.
        with session.clock.phase(CACHE):
            cache.store(session, own, result)
    result.release_runners()  # losers: no session, thread pool or weights left alive
    return result


def _measure_shapes(session: GraphSession, result: GraphResult) -> None:
    """Per-shape latencies of the winner and eager on a ranged graph.

    The mean over the recorded mix decided the winner; these show how each size fares.
    """
    if result.winner is None or not session.graph.key.is_dynamic:
        return
    eager = next((r for r in result.rows if r.backend.kind == "eager" and r.usable), None)
    rows = [result.winner] + ([eager] if eager is not None and eager is not result.winner else [])
    session.measure_shapes(rows)


def _eta(started: float, done: int, todo: list[Any]) -> str:
    """``graph i/n, ETA s`` for the progress line (estimated from the graphs so far)."""
    elapsed = time.perf_counter() - started
    left = elapsed / (done + 1) * (len(todo) - done - 1)
    return f"graph {done + 1}/{len(todo)}, ETA {left:.0f} s"


def plan_from(results: list[GraphResult], depth: int) -> Plan:
    """The plan made of every graph's winner."""
    entries = [
        PlanEntry(
            g.path,
            g.graph.key,
            g.winner.backend,
            g.winner.runner,
            g.winner.latency_s,
            g.eager_latency_s,
        )
        for g in results
        if g.winner is not None and g.winner.runner is not None
    ]
    unserved = {(g.path, g.graph.key): g.why_no_runner() for g in results if not g.has_runner}
    return Plan(entries, depth, unserved=unserved)


def release_unplanned(graphs: Iterable[list[GraphResult]], plans: Iterable[Plan]) -> None:
    """Drop every candidate's runner that none of ``plans`` serves.

    A tuned model keeps no loser's threads or memory (:meth:`GraphResult.release_runners`).
    """
    serving = [entry.runner for plan in plans for entry in plan.entries]
    for results in graphs:
        for graph_result in results:
            graph_result.release_runners(keep=serving)


def check_untuned(model: Any) -> None:
    """Refuse a model that still carries dispatchers from an earlier tune."""
    already = wrapped_paths(model)
    if already:
        raise InvalidInputError(
            f"the model is already tuned ({len(already)} wrapped modules, e.g. "
            f"{already[0] or '<model>'}); call result.undo() or tt.unwrap(model) first"
        )


def check_device(model: Any, device: torch.device | str | None) -> torch.device:
    """The tuning device; refuses a device other than where the model's weights are."""
    here = resolve_device(model, None)
    dev = resolve_device(model, device)
    if device is not None and dev.type != here.type:
        raise InvalidInputError(
            f"the model's weights are on {here} but device={dev} was asked for: "
            f"move the model first (model.to({str(dev)!r}))"
        )
    return dev


def tune(
    model: Any,
    dataset: Iterable[Any],
    *,
    depth: int = 0,
    config: TuneConfig | None = None,
    strategy: Strategy | Unset | None = UNSET,
    device: torch.device | str | Unset | None = UNSET,
    call: CallFn | Unset | None = UNSET,
    tolerances: Tolerances | Unset | None = UNSET,
    measure_config: MeasureConfig | Unset | None = UNSET,
    dry_run: bool | Unset = UNSET,
    verbose: bool | Unset = UNSET,
    info: ModelInfo | None = None,
    cache: GraphCache | str | os.PathLike[str] | bool | Unset | None = UNSET,
    dynamic_shapes: DynamicShapes | Unset = UNSET,
    allow_training: bool | Unset = UNSET,
) -> TuneResult:
    """Tune one cut: every executed module at ``depth`` plus executed leaves shallower than it.

    Each graph (input signature) of each module gets its own copy of the strategy; the
    winner of each serves it, checked against eager on the recorded calls, so results are
    kept. At depth 0 ``result.model`` is a new object sharing the model's parameters and the
    object given in stays untuned (for a pipeline, or a model whose forward never runs
    through ``__call__`` such as a ``generate`` loop, depth 0 is the outermost modules it
    calls: ``print(tt.inspect(...))`` says which). At deeper cuts the modules inside
    ``model`` are wrapped in place (``result.undo()`` reverts). Tuning never changes the
    model's buffers, parameters or the RNG state.

    Args:
        model: An ``nn.Module`` in eval mode, or a plain object whose attributes hold modules
            (a pipeline), run by ``call``.
        dataset: What the model is called with, one item per call (a tensor, a tuple of
            positional arguments or a dict of keywords), as in :func:`tunetree.inspect`.
        depth: The cut: 0 the whole model, 1 its children, and so on.
        config: The settings below as one :class:`tunetree.TuneConfig`; a keyword given
            beside it must agree with it.
        strategy: The candidates per graph and how the winner is picked (None:
            :func:`tunetree.default_strategy` for the device).
        device: Where to tune (None: where the model's weights are).
        call: ``call(model, *args, **kwargs)`` runs one item (None: ``model(...)``).
        tolerances: How close to eager a candidate's outputs must be (None: the defaults).
        measure_config: How candidates are timed (None: :class:`tunetree.MeasureConfig`).
        dry_run: Report what the cut would wrap; tune nothing.
        verbose: Progress on the ``tunetree.progress`` logger at INFO (else DEBUG).
        info: The model's :func:`tunetree.inspect` result, when already at hand.
        cache: The tuning cache for graphs tuned before (same module structure, graph,
            strategy, environment): None or True ``$TUNETREE_CACHE_DIR`` or
            ``~/.cache/tunetree``, a path another directory, a :class:`tunetree.TuningCache`,
            False none.
        dynamic_shapes: None (axes that vary across the items become ranges served by one
            runner), False (every exact shape is its own graph) or a torch.export-style nest
            of :class:`tunetree.Dim` for the model's inputs (with ``call``, the call's own:
            a ``generate`` prompt's envelope).
        allow_training: Tune a model with modules in training mode (its eval behaviour; the
            runners serve eval mode only); refused otherwise.

    Returns:
        A :class:`TuneResult`: call ``result.model``; ``print(result)`` shows every candidate.

    Raises:
        InvalidInputError: The model is in training mode, already tuned or on another device
            than ``device``, the dataset is empty, or a setting is of the wrong kind or
            disagrees with ``config``.
        CacheError: A ``cache`` of none of the kinds above, or a directory that cannot be used.

    Example:
        >>> import torch, tunetree as tt
        >>> x, model = torch.randn(2, 8), torch.nn.Linear(8, 8).eval()
        >>> result = tt.tune(model, [x], strategy=tt.OneBackendStrategy(
        ...     tt.backends.Eager()), cache=False, verbose=False,
        ...     measure_config=tt.MeasureConfig.quick())
        >>> torch.equal(result.model(x), model(x))
        True
    """
    cfg = settings(
        config,
        strategy=strategy,
        device=device,
        call=call,
        tolerances=tolerances,
        measure_config=measure_config,
        dry_run=dry_run,
        verbose=verbose,
        cache=cache,
        dynamic_shapes=dynamic_shapes,
        allow_training=allow_training,
    )
    return _tune(model, dataset, depth, cfg, info)


def _tune(
    model: Any, dataset: Iterable[Any], depth: int, cfg: TuneConfig, info: ModelInfo | None
) -> TuneResult:
    """:func:`tune` with its settings resolved."""
    check_untuned(model)
    if not cfg.allow_training:
        check_eval_mode(model)
    dev = check_device(model, cfg.device)
    progress = Progress(cfg.verbose)
    clock = Stopwatch()
    with preserved_state(model), eval_mode(model):
        if info is None:
            progress("inspecting the model")
            with clock.phase(INSPECTION):
                info = inspect(
                    model,
                    dataset,
                    call=cfg.call,
                    device=dev,
                    dynamic_shapes=cfg.dynamic_shapes,
                    max_depth=depth,
                )
        if cfg.dry_run:
            return TuneResult(model, depth, Plan([], depth), [], info, dry_run=True, original=model)
        graphs = tune_cut(
            model,
            info,
            depth,
            strategy=cfg.strategy,
            tolerances=cfg.tolerances or Tolerances(),
            measure_config=cfg.measure_config or MeasureConfig(),
            progress=progress,
            cache=open_cache(cfg.cache),
            clock=clock,
            most_time_first=is_generation(info, model),
        )
    plan = plan_from(graphs, depth)
    release_unplanned([graphs], [plan])
    tuned = wrap(model, plan.runners(), plan, in_place=depth > 0)
    if plan.runners():
        with preserved_state(model), clock.phase(END_TO_END_CHECK):
            serve_once(tuned, info, cfg.call)
        mark_unserved(tuned, graphs)
    return TuneResult(tuned, depth, plan, graphs, info, original=model, breakdown=clock.breakdown())
