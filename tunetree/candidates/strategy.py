"""Strategies: which candidates to build for a graph and how to pick the winner.

Every graph gets its own strategy instance (:meth:`Strategy.copy`), so no state is
shared between graphs or between tunes. A strategy returns a row for every candidate,
not only the winner.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from .._util.table import format_table
from ..backends import Backend, default_backends, reduced_precision_backends
from ..errors import InvalidInputError
from ..signature.binding import original_forward
from ..signature.graph import Graph, Sample, flatten, unflatten
from .evaluate import CandidateRow, GraphSession, Status

log = logging.getLogger(__name__)


@dataclass
class StrategyOutcome:
    """Every candidate's row and the winning row (None when no candidate is usable)."""

    rows: list[CandidateRow]
    winner: CandidateRow | None


class Strategy:
    """Base class of strategies: candidate backends in the order they are tried, and a choice.

    Subclass it and implement :meth:`select` for a custom choice. Every graph gets its own copy
    (:meth:`copy`), so no state is shared between graphs or tunes.

    Args:
        backends: The candidates, in order.

    Raises:
        InvalidInputError: No backend, or an object that is not a backend.

    Example:
        >>> import tunetree as tt
        >>> class Second(tt.Strategy):
        ...     def select(self, measured):
        ...         return measured[min(1, len(measured) - 1)]
        >>> Second([tt.backends.Eager()]).describe()
        'Second'
    """

    fastest_wins: ClassVar[bool] = False
    """True when :meth:`select` picks the fastest candidate: candidates that cannot be within
    the screening margin of the leader are then dropped after a short screening measurement
    (see :meth:`GraphSession.measure`)."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        if not backends:
            raise InvalidInputError(f"{type(self).__name__} needs at least one backend")
        for backend in backends:
            if not isinstance(backend, Backend):
                raise InvalidInputError(
                    f"{backend!r} is not a backend: use e.g. tt.backends.Inductor()"
                )
        self.backends: list[Backend] = list(backends)

    def copy(self) -> Strategy:
        """An independent instance for one graph."""
        return copy.deepcopy(self)

    def run(self, session: GraphSession) -> StrategyOutcome:
        """Evaluate candidates for the session's graph and choose a winner.

        Under a time budget the candidates are built cheapest per expected win first
        (:meth:`GraphSession.build_order`); the rows stay in the strategy's order.
        """
        rows = self.evaluate_all(session)
        session.measure(rows, screen=self.fastest_wins)
        measured = [r for r in rows if r.usable and r.timing is not None and not r.screened_out]
        return StrategyOutcome(rows, self.select(measured) if measured else None)

    def evaluate_all(self, session: GraphSession) -> list[CandidateRow]:
        """Every backend's row, built in :meth:`GraphSession.build_order`, in backend order."""
        order = session.build_order(self.backends)
        rows: dict[int, CandidateRow] = {}
        for backend in order:
            index = next(i for i, b in enumerate(self.backends) if b is backend and i not in rows)
            rows[index] = session.evaluate(backend)
        return [rows[i] for i in range(len(self.backends))]

    def select(self, measured: list[CandidateRow]) -> CandidateRow:
        """Pick the winner among measured, correct rows (in backend order)."""
        raise NotImplementedError

    def for_twin(self, winners: Sequence[Backend]) -> Strategy | None:
        """The strategy for a graph whose twin (same structure, same graph) ``winners`` won.

        ``winners`` is the twin's winner, then (when the winner changes results) its fastest
        results-keeping candidate, which an accuracy budget's repair returns to. None: tune it
        in full. Strategies where the fastest wins narrow the race to those and eager, which
        are built, checked and measured on this graph as always: the same computation on other
        weights is not worth every candidate's build again.
        """
        return None

    def describe(self) -> str:
        """The strategy's name as reports show it."""
        return type(self).__name__

    def __str__(self) -> str:
        return format_table(
            ["#", "backend", "keeps results", "config"],
            [
                [i + 1, b.name, "yes" if b.preserves_results else "no (opt-in)", b.config()]
                for i, b in enumerate(self.backends)
            ],
            title=self.describe(),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}([{', '.join(b.name for b in self.backends)}])"


class FirstWinsStrategy(Strategy):
    """The first candidate, in the given order, that builds and matches eager wins.

    Later candidates are not built (the cheapest tuning).

    Args:
        backends: The candidates, most preferred first.

    Raises:
        InvalidInputError: No backend, or an object that is not a backend.

    Example:
        >>> import tunetree as tt
        >>> strategy = tt.FirstWinsStrategy([tt.backends.OpenVINO(), tt.backends.Eager()])
    """

    def run(self, session: GraphSession) -> StrategyOutcome:
        """Evaluate candidates in order until one is usable and measured; later ones are skipped."""
        rows: list[CandidateRow] = []
        winner = None
        for backend in self.backends:
            if winner is not None:
                rows.append(CandidateRow(backend, Status.SKIPPED, "an earlier candidate won"))
                continue
            row = session.evaluate(backend)
            rows.append(row)
            if row.usable:
                session.measure([row])
                winner = row if row.timing is not None else None
        return StrategyOutcome(rows, winner)


class OneBackendStrategy(FirstWinsStrategy):
    """Use exactly one backend; the module keeps its forward if that backend fails.

    Args:
        backend: The one candidate.

    Raises:
        InvalidInputError: ``backend`` is not a backend.

    Example:
        >>> import tunetree as tt
        >>> tt.OneBackendStrategy(tt.backends.Eager()).describe()
        'OneBackendStrategy'
    """

    def __init__(self, backend: Backend) -> None:
        super().__init__([backend])


class _TwinsNarrowed(Strategy):
    """A strategy where the fastest wins, so a twin's race can be narrowed to its winner.

    ``share_twins=False`` tunes every graph in full.
    """

    fastest_wins: ClassVar[bool] = True

    def __init__(self, backends: Sequence[Backend], *, share_twins: bool = True) -> None:
        super().__init__(backends)
        self.share_twins = share_twins

    def for_twin(self, winners: Sequence[Backend]) -> Strategy | None:
        """A copy racing ``winners`` against eager only (None with ``share_twins=False``)."""
        if not self.share_twins:
            return None
        narrowed = self.copy()
        eager = [b for b in self.backends if b.kind == "eager" and b not in winners]
        narrowed.backends = [*winners, *eager]
        return narrowed


class MinLatencyStrategy(_TwinsNarrowed):
    """Measure every candidate; the lowest median latency wins.

    Args:
        backends: The candidates.
        share_twins: False tunes every twin (a module with the structure and graph of one
            already tuned) in full instead of racing that one's winner against eager.

    Raises:
        InvalidInputError: No backend, or an object that is not a backend.

    Example:
        >>> import tunetree as tt
        >>> strategy = tt.MinLatencyStrategy([tt.backends.OnnxRuntime(), tt.backends.Eager()])
    """

    def select(self, measured: list[CandidateRow]) -> CandidateRow:
        """The measured candidate with the lowest median latency."""
        return min(measured, key=lambda r: r.latency_s or float("inf"))


class HighestThroughputStrategy(_TwinsNarrowed):
    """Measure every candidate; the highest throughput (samples per second) wins.

    Modules with the same structure and graph as one already tuned (the layers of a stack)
    race only that one's winner against eager (see :meth:`Strategy.for_twin`).

    Args:
        backends: The candidates.
        search_max_batch_size: Also rebuild each usable candidate at doubled batch sizes (along
            axis 0) until throughput grows by less than 5 % or memory runs out; the largest
            useful batch is reported per row and throughput is compared there. The tuned plan
            still serves the graph that was recorded.
        max_batch_size: The largest batch that search tries.
        share_twins: False tunes every twin in full.

    Raises:
        InvalidInputError: No backend, or an object that is not a backend.

    Example:
        >>> import tunetree as tt
        >>> strategy = tt.HighestThroughputStrategy([tt.backends.Inductor(), tt.backends.Eager()])
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        *,
        search_max_batch_size: bool = False,
        max_batch_size: int = 1024,
        share_twins: bool = True,
    ) -> None:
        super().__init__(backends, share_twins=share_twins)
        self.search_max_batch_size = search_max_batch_size
        self.max_batch_size = max_batch_size

    def for_twin(self, winners: Sequence[Backend]) -> Strategy | None:
        """As for every strategy where the fastest wins; None with the batch size search."""
        return None if self.search_max_batch_size else super().for_twin(winners)

    def select(self, measured: list[CandidateRow]) -> CandidateRow:
        """The measured candidate with the highest throughput."""
        return max(measured, key=lambda r: r.throughput or 0.0)

    def run(self, session: GraphSession) -> StrategyOutcome:
        """Measure every candidate; with ``search_max_batch_size``, also search larger batches.

        The winner is then the usable candidate with the highest throughput at its best batch size.
        """
        outcome = super().run(session)
        if not self.search_max_batch_size or outcome.winner is None:
            return outcome
        best: dict[int, float] = {}
        for i, row in enumerate(outcome.rows):
            if row.usable and row.throughput is not None and not row.screened_out:
                best[i] = self._search(session, row)
        winner_index = max(best, key=lambda i: best[i])
        return StrategyOutcome(outcome.rows, outcome.rows[winner_index])

    def _search(self, session: GraphSession, row: CandidateRow) -> float:
        throughput = row.throughput or 0.0
        row.max_batch_size = row.batch
        factor = 2
        while row.batch * factor <= self.max_batch_size:
            try:
                graph = _scaled_graph(session.module, session.graph, factor)
            except Exception as exc:
                log.info("batch search stopped for %s: %s", row.backend.name, exc)
                break
            # replace() keeps the session's measure lock (the cache's device lock); builds
            # of the search are not reported to on_build, as before.
            scaled = dataclasses.replace(session, graph=graph, on_build=None)
            candidate = scaled.evaluate(row.backend)
            if candidate.usable:
                scaled.measure([candidate])
            if candidate.throughput is None or candidate.throughput < throughput * 1.05:
                break
            throughput = candidate.throughput
            row.max_batch_size = candidate.batch
            factor *= 2
            if session.device.type == "cuda":
                torch.cuda.empty_cache()
        return throughput

    def describe(self) -> str:
        """The strategy's name as reports show it, noting the batch size search."""
        extra = " (max batch size search)" if self.search_max_batch_size else ""
        return f"HighestThroughputStrategy{extra}"


class LatencyTargetStrategy(Strategy):
    """The first candidate, in the given order, whose median latency is within a target.

    When none is, the fastest one. Use it when "fast enough" matters more than "fastest": the
    order of ``backends`` is the order of preference. (The time a tune may take is
    ``auto_tune``'s ``time_budget``; the error it may add is an ``AccuracyBudget``.)

    Args:
        target_ms: The latency per call, in milliseconds, a candidate must reach.
        backends: The candidates, most preferred first.

    Raises:
        InvalidInputError: ``target_ms`` is not positive.

    Example:
        >>> import tunetree as tt
        >>> strategy = tt.LatencyTargetStrategy(5.0, [tt.backends.Eager()])
        >>> strategy.describe()
        'LatencyTargetStrategy(5 ms)'
    """

    def __init__(self, target_ms: float, backends: Sequence[Backend]) -> None:
        if target_ms <= 0:
            raise InvalidInputError("target_ms must be positive")
        super().__init__(backends)
        self.target_ms = target_ms

    def select(self, measured: list[CandidateRow]) -> CandidateRow:
        """The first measured candidate within ``target_ms``, else the fastest one."""
        for row in measured:
            if row.latency_s is not None and row.latency_s * 1e3 <= self.target_ms:
                return row
        fastest = min(measured, key=lambda r: r.latency_s or float("inf"))
        log.info("no candidate within %.3g ms; using the fastest, %s", self.target_ms, fastest)
        return fastest

    def describe(self) -> str:
        """The strategy's name as reports show it, with its target."""
        return f"LatencyTargetStrategy({self.target_ms:g} ms)"


class LatencyBudgetStrategy(LatencyTargetStrategy):
    """Deprecated name of :class:`LatencyTargetStrategy` (``budget_ms`` is ``target_ms``).

    Kept for one release; constructing it warns.
    """

    def __init__(self, budget_ms: float, backends: Sequence[Backend]) -> None:
        warnings.warn(
            "LatencyBudgetStrategy(budget_ms, backends) is renamed "
            "tunetree.LatencyTargetStrategy(target_ms, backends)",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(budget_ms, backends)

    @property
    def budget_ms(self) -> float:
        """The old name of :attr:`target_ms`."""
        return self.target_ms


def default_strategy(device: torch.device | str = "cpu") -> HighestThroughputStrategy:
    """Highest throughput over every registered backend that runs on ``device``.

    Only backends that keep the model's results are considered. Backends that cannot run here
    are left out with one log line naming what to install.

    Args:
        device: The device the model runs on.

    Returns:
        A :class:`HighestThroughputStrategy`; ``print()`` it to see its backends.

    Example:
        >>> import tunetree as tt
        >>> all(b.preserves_results for b in tt.default_strategy("cpu").backends)
        True
    """
    dev = torch.device(device)
    chosen = []
    for backend in default_backends(dev):
        if not backend.preserves_results:
            continue
        reason = backend.unavailable_reason(dev)
        if reason:
            # A missing package is actionable (the reason names the extra): say it loudly.
            level = logging.WARNING if "pip install" in reason else logging.INFO
            log.log(level, "default strategy on %s leaves out %s: %s", dev, backend.name, reason)
            continue
        chosen.append(backend)
    return HighestThroughputStrategy(chosen)


def accuracy_strategy(
    device: torch.device | str = "cpu", quick: bool = False
) -> HighestThroughputStrategy:
    """:func:`default_strategy` plus the results-changing candidates an accuracy budget allows.

    What ``auto_tune(accuracy=...)`` tries when no strategy is given: every default backend and
    :func:`tunetree.backends.reduced_precision_backends` that run on ``device``. Each candidate
    is admitted by its measured error (see :class:`tunetree.AccuracyBudget`).

    Args:
        device: The device the model runs on.
        quick: Only the backends that build quickly.

    Returns:
        A :class:`HighestThroughputStrategy`.

    Example:
        >>> import tunetree as tt
        >>> strategy = tt.accuracy_strategy("cpu")
    """
    dev = torch.device(device)
    base = quick_strategy(dev) if quick else default_strategy(dev)
    extra = []
    for backend in reduced_precision_backends(dev):
        reason = backend.unavailable_reason(dev)
        if reason:
            log.info("accuracy strategy on %s leaves out %s: %s", dev, backend.name, reason)
        elif backend.quick_build or not quick:
            extra.append(backend)
    others = [b for b in base.backends if b.kind != "eager"]
    eager = [b for b in base.backends if b.kind == "eager"]
    return HighestThroughputStrategy([*others, *extra, *eager])


def quick_strategy(device: torch.device | str = "cpu") -> HighestThroughputStrategy:
    """:func:`default_strategy` without the backends that build slowly (``quick_build=False``).

    What ``auto_tune(quick=True)`` tries: on a CPU OpenVINO, ONNX Runtime and eager, without
    Inductor's compiles; on CUDA graph capture, ONNX Runtime and eager.

    Args:
        device: The device the model runs on.

    Returns:
        A :class:`HighestThroughputStrategy`.

    Example:
        >>> import tunetree as tt
        >>> "inductor" in [b.kind for b in tt.quick_strategy("cpu").backends]
        False
    """
    quick = [b for b in default_strategy(device).backends if b.quick_build]
    return HighestThroughputStrategy(quick)


def _scaled_graph(module: torch.nn.Module, graph: Graph, factor: int) -> Graph:
    """The graph with every sample's tensors repeated ``factor`` times along axis 0.

    Also returns eager's outputs for them.
    """

    def scale(sample: Sample) -> Sample:
        leaves, spec = flatten((sample.args, sample.kwargs))
        scaled = [
            torch.cat([leaf] * factor) if isinstance(leaf, torch.Tensor) and leaf.dim() else leaf
            for leaf in leaves
        ]
        args, kwargs = unflatten(scaled, spec)
        return Sample(tuple(args), dict(kwargs))

    samples = [scale(s) for s in graph.samples[:1]]
    forward = original_forward(module)
    with torch.no_grad():
        outputs = [s.run(forward) for s in samples]
    return Graph(samples[0].key, samples, outputs)
