"""What tuning one graph produces, and what a persistent cache of such results offers.

Kept below both :mod:`tunetree.tune` and :mod:`tunetree.cache` so the cache depends only
downward: tune uses a cache through :class:`GraphCache`, and the cache builds
:class:`GraphResult` objects without importing tune.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .._util.table import format_table
from ..signature.graph import Graph
from .budget import TIME_BUDGET_ERROR
from .evaluate import CandidateRow, GraphSession

if TYPE_CHECKING:
    from ..backends.base import Runner
    from .strategy import Strategy


@dataclass
class GraphResult:
    """Every candidate's row for one graph of one module, and the winner."""

    path: str
    graph: Graph = field(repr=False)
    rows: list[CandidateRow]
    winner: CandidateRow | None
    strategy: str = ""
    never_served: bool = False
    """The winner's dispatcher never served a call of the tuning data with it (the calls were
    keyed otherwise): its measured speed-up is not the model's, and tables do not show it."""

    @property
    def cached(self) -> bool:
        """Whether this result was served from a tuning cache (its strategy text says so)."""
        return "(cached" in self.strategy

    @property
    def cut_short(self) -> bool:
        """Whether the time budget skipped any of the graph's candidates (a partial race)."""
        return any(r.reason == TIME_BUDGET_ERROR for r in self.rows)

    @property
    def has_runner(self) -> bool:
        """Whether the graph has a winner with a runner: what a plan can install for it."""
        return self.winner is not None and self.winner.runner is not None

    def why_no_runner(self, limit: int = 160) -> str:
        """Why no runner serves this graph, from its rows, in a line ("" when one does).

        Each candidate's status and reason (each cut to ``limit`` characters).
        """
        if self.has_runner:
            return ""
        if self.winner is not None:
            return f"the runner of its winner, {self.winner.backend.name}, was not kept"
        if not self.rows:
            return "no candidate was tried"
        parts = []
        for row in self.rows:
            text = row.describe()
            parts.append(
                f"{row.backend.name} {text if len(text) <= limit else text[:limit] + '...'}"
            )
        return "; ".join(parts)

    @property
    def eager_latency_s(self) -> float | None:
        """Median latency of the eager row, or None when eager was not measured."""
        for row in self.rows:
            if row.backend.kind == "eager" and row.timing is not None:
                return row.timing.median_s
        return None

    def fastest_keeping(self) -> CandidateRow | None:
        """The fastest usable results-keeping candidate other than eager, or None.

        A candidate the screening dropped counts: it is correct, and its screening timing ranks
        it. What an accuracy budget's repair gives a graph back to.
        """
        keeping = [
            r
            for r in self.rows
            if r.usable
            and r.backend.preserves_results
            and r.backend.kind != "eager"
            and r.latency_s is not None
        ]
        return min(keeping, key=lambda r: r.latency_s or 0.0, default=None)

    def best_per_kind(self) -> dict[str, CandidateRow]:
        """Each backend kind's fastest usable measured row (the winner stands for its kind).

        What a plan can still pick after the choice: a single-runtime plan, the best
        whole-model backend, an accuracy budget's repair.
        """
        best: dict[str, CandidateRow] = {}
        for row in self.rows:
            if not row.usable or row.latency_s is None:
                continue
            held = best.get(row.backend.kind)
            if held is None or row.latency_s < (held.latency_s or 0.0):
                best[row.backend.kind] = row
        if self.winner is not None and self.winner.usable:
            best[self.winner.backend.kind] = self.winner
        return best

    def release_runners(self, keep: Collection[Runner] | None = None) -> int:
        """Drop the runners that no plan will use, so none keeps threads or memory.

        A losing candidate's runner holds its backend's session, thread pool and weights
        while later candidates and depths are measured: nothing of it may slow them. With
        ``keep`` None the rows of :meth:`best_per_kind` keep theirs; otherwise only the
        runners in ``keep`` stay; a runner that is not ``releasable`` (a device graph) always
        stays. The rows keep their status and timings; returns how many runners were dropped.
        """
        if keep is None:
            kept = {id(r.runner) for r in self.best_per_kind().values()}
        else:
            kept = {id(runner) for runner in keep}
        dropped = 0
        for row in self.rows:
            if row.runner is not None and row.runner.releasable and id(row.runner) not in kept:
                row.runner = None
                dropped += 1
        return dropped

    def per_shape_table(self) -> str:
        """Latency of the winner and eager on each recorded shape of a ranged graph.

        Empty when the graph has one shape or nothing was measured per shape.
        """
        rows = [r for r in self.rows if r.per_shape]
        if not rows:
            return ""
        labels = list(rows[0].per_shape)
        return format_table(
            ["shape", *(r.backend.name for r in rows)],
            [[label, *(str(r.per_shape.get(label, "-")) for r in rows)] for label in labels],
            title=f"{self.path or '<model>'} {self.graph.key}: latency per recorded shape",
        )


class GraphCache(Protocol):
    """What :func:`tune_cut` asks of a persistent tuning cache (see :mod:`tunetree.cache`)."""

    def lookup(self, session: GraphSession, strategy: Strategy) -> GraphResult | None:
        """A validated earlier result for this graph, or None (a miss or an invalid entry)."""

    def store(self, session: GraphSession, strategy: Strategy, result: GraphResult) -> None:
        """Record a fresh result; must never raise for I/O problems (log them instead)."""
