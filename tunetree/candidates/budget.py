"""Tuning time: a budget's deadline and a stopwatch of where the time went.

Both read one clock, :func:`now`, that tests can replace.

``auto_tune(time_budget=...)`` asks the :class:`Deadline` before every depth, graph, candidate
build and measurement whether that work is expected to end in time, and measurements stop their
trial loops at it (see :func:`tunetree.auto_tune`). A :class:`Stopwatch` charges every moment of
a tune to exactly one phase (the innermost one open), so the phases of its
:class:`TimeBreakdown` add up to the wall time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .._util.interrupt import raised_after
from .._util.table import format_table
from ..backends.compile_pool import close_compile_pool
from .build_costs import BuildCosts

TIME_BUDGET_ERROR = "time budget used up"

INSPECTION = "inspection"
SETUP = "setup"
"""Choosing the strategy's backends (their availability checks import runtimes), the cache."""
BUILD = "build"
"""A candidate's build and its first run on every sample (a lazy compile happens there)."""
CHECK = "check"
"""Comparison of a candidate's outputs with eager's, on the samples and on probes."""
SCREENING = "screening"
MEASUREMENT = "measurement"
REMATCH = "rematch"
SHAPES = "per-shape measurement"
CACHE = "cache"
END_TO_END_CHECK = "end-to-end check"
END_TO_END = "end-to-end measurement"
OTHER = "other"
"""Time inside no phase: planning, wrapping, bookkeeping."""


class BuildStopped(BaseException):
    """Raised inside a build the time budget stopped (see :func:`stopped_after`).

    A ``BaseException``, like ``KeyboardInterrupt``, so that no library's ``except Exception``
    takes it for a failure of its own and carries on.
    """


@contextlib.contextmanager
def stopped_after(seconds: float) -> Iterator[None]:
    """Raise :class:`BuildStopped` in this thread if the block runs longer than ``seconds``.

    Raised asynchronously at this thread's next Python instruction, so a block inside a long C
    call (a compiler subprocess) stops when that call returns, and raised again until the block
    ends (:func:`tunetree._util.interrupt.raised_after`). After a stop the compiles Inductor had
    queued are cancelled (:mod:`tunetree.backends.compile_pool`).
    """
    interrupt = None
    try:
        with raised_after(seconds, BuildStopped) as interrupt:
            yield
    finally:
        if interrupt is not None and interrupt.fired:  # queued kernels would compile on
            close_compile_pool()


def now() -> float:
    """The clock every deadline reads (a module function, so a test can substitute it)."""
    return time.perf_counter()


@dataclass
class Deadline:
    """The moment a time budget runs out, on :func:`now`'s clock.

    ``reserve_s`` is time kept free for work that must follow what is being decided (the
    end-to-end measurement of the depth in progress): a build or a measurement is started only
    when it is expected to end ``reserve_s`` before the deadline.

    The free time is shared out: each graph tuned inside :meth:`graph_window` gets an equal
    share of what is free when it starts (with the graphs left in its cut and one share per
    depth still to come, :attr:`depths_after`), and a build that would run past its graph's
    share is not started, or stopped (:meth:`build_cap_s`), unless it is the graph's first
    candidate besides eager. A graph's later candidates also leave the time the next graphs'
    first candidates are expected to take (:attr:`kept_s`).
    """

    at: float
    builds: dict[str, float] = field(default_factory=dict, compare=False, repr=False)
    """The longest build (with its checks) seen so far per backend kind."""
    reserve_s: float = field(default=0.0, compare=False)
    costs: BuildCosts = field(default_factory=BuildCosts, compare=False, repr=False)
    """Every build's time by backend and graph size, and the races won: what a build is
    expected to cost and which candidates are built first (:mod:`.build_costs`)."""
    depths_after: int = field(default=0, compare=False)
    """Depths still to be tuned after the one in progress: each is kept one graph's share."""
    window_at: float | None = field(default=None, compare=False)
    """When the share of the graph in progress ends (None: no graph in progress)."""
    kept_s: float = field(default=0.0, compare=False)
    """Seconds kept for the first candidates of the graphs after the one in progress: a
    graph's later candidates may not use them (its first may), so that one graph's second
    build never leaves the next graphs without any (see :meth:`graph_window`)."""

    @classmethod
    def after(cls, seconds: float, start: float | None = None) -> Deadline:
        """The deadline ``seconds`` after ``start`` (default: now)."""
        return cls((now() if start is None else start) + seconds)

    def passed(self) -> bool:
        """True once the deadline has passed."""
        return now() > self.at

    def left_s(self) -> float:
        """Seconds left until the deadline (0 once passed)."""
        return max(0.0, self.at - now())

    @contextlib.contextmanager
    def build(self, kind: str) -> Iterator[None]:
        """Time the block as one build of backend ``kind`` (see :meth:`room_for`)."""
        start = now()
        try:
            yield
        finally:
            self.builds[kind] = max(now() - start, self.builds.get(kind, 0.0))

    def expected_build_s(
        self, kind: str, size: int | None = None, prior_s: float | None = None
    ) -> float:
        """How long a build of ``kind`` is expected to take.

        With ``size`` (the graph's modules; ``kind`` is then the backend's name, kind and
        config), from what this tune knows of that backend on graphs of that size
        (:meth:`BuildCosts.expected_s`, ``prior_s`` until it was built once). Without, the
        longest build of that kind so far, else the longest of any kind.
        """
        if size is not None:
            return self.costs.expected_s(kind, size, prior_s)
        if kind in self.builds:
            return self.builds[kind]
        return max(self.builds.values(), default=0.0)

    def room_for(self, kind: str) -> bool:
        """Whether a build of ``kind`` is expected to end before the deadline (and its reserve).

        So a budget is overrun by at most one unexpectedly long build, instead of one build of
        whichever backend comes next.
        """
        return self.room_for_s(self.expected_build_s(kind))

    def free_s(self) -> float:
        """Seconds left before the reserve (0 once only the reserve is left)."""
        return max(0.0, self.left_s() - self.reserve_s)

    def room_for_s(self, seconds: float) -> bool:
        """Whether work expected to take ``seconds`` ends before the deadline and its reserve."""
        return not self.passed() and seconds + self.reserve_s <= self.left_s()

    @contextlib.contextmanager
    def reserving(self, seconds: float) -> Iterator[None]:
        """Keep ``seconds`` free at the end of the budget while the block runs."""
        before = self.reserve_s
        self.reserve_s = seconds
        try:
            yield
        finally:
            self.reserve_s = before

    @contextlib.contextmanager
    def graph_window(
        self, graphs_left: int, part: float | None = None, kept_s: float = 0.0
    ) -> Iterator[None]:
        """While the block tunes one graph, its builds may run until the graph's share ends.

        The cut's part of the free time is ``graphs_left`` over ``graphs_left`` plus
        :attr:`depths_after` (this graph and those of its cut still to tune, cache hits and
        twins left out; each depth to come is kept one graph's share). This graph gets
        ``part`` of the cut's part: by default an equal share, ``1 / graphs_left``; a
        ``generate`` call's graphs get their part of eager time, so the decode step, where
        the time goes, may build its slow candidates. Time a graph leaves unused goes to the
        next ones. ``kept_s`` is what the first candidates of the graphs after this one are
        expected to take (:attr:`kept_s`): this graph's candidates after its first leave it free.
        """
        before, kept_before = self.window_at, self.kept_s
        graphs = max(1, graphs_left)
        share = (1.0 / graphs if part is None else part) * graphs / (graphs + self.depths_after)
        self.window_at = now() + self.free_s() * share
        self.kept_s = max(0.0, kept_s)
        try:
            yield
        finally:
            self.window_at, self.kept_s = before, kept_before

    def window_left_s(self) -> float:
        """Seconds left of the share of the graph in progress (the free time outside one)."""
        if self.window_at is None:
            return self.free_s()
        return min(self.free_s(), max(0.0, self.window_at - now()))

    def room_to_build(self, expected_s: float, then_s: float, first: bool) -> bool:
        """Whether a build expected to take ``expected_s``, then ``then_s`` of work, fits.

        It must end, with ``then_s`` (the short measurement of its candidate), before the
        deadline's reserve, and within its graph's share unless it is ``first``: the graph's
        first candidate besides eager is built whenever one fits in the free time. A later
        candidate also leaves :attr:`kept_s` free for the next graphs' first candidates.
        """
        if not self.room_for_s(expected_s + then_s):
            return False
        if first:
            return True
        return expected_s <= self.window_left_s() and (
            expected_s + then_s + self.kept_s <= self.free_s()
        )

    def build_cap_s(self, expected_s: float, first: bool, then_s: float = 0.0) -> float:
        """How long a build started now may run before it is stopped (:func:`stopped_after`).

        Until its graph's share ends, less ``then_s`` (the short measurement of the graph's
        candidates, which must still fit); a graph's ``first`` candidate besides eager at least
        twice its ``expected_s``; never past the free time (less ``then_s``).
        """
        free = max(0.0, self.free_s() - then_s)
        cap = min(free, max(0.0, self.window_left_s() - then_s))
        if first:
            return max(cap, min(free, 2.0 * expected_s))
        return min(cap, max(0.0, free - self.kept_s))


@dataclass(frozen=True)
class PhaseTime:
    """Time charged to one phase (with its detail, e.g. the backend of a build)."""

    phase: str
    detail: str
    seconds: float
    count: int
    """How many times the phase was entered."""

    @property
    def label(self) -> str:
        """``build (inductor)``: the phase as tables show it."""
        return f"{self.phase} ({self.detail})" if self.detail else self.phase


@dataclass(frozen=True)
class TimeBreakdown:
    """Where a tune's wall time went, phase by phase; the phases and ``other`` add up to it.

    ``result.breakdown`` of :func:`tunetree.tune` and :func:`tunetree.auto_tune`;
    ``print()`` it for a table.

    Attributes:
        wall_s: The tune's wall time.
        phases: One :class:`PhaseTime` per phase (inspection, builds and checks per backend,
            measurement, cache, end to end ...).

    Example:
        >>> import tunetree as tt
        >>> tt.TimeBreakdown(wall_s=2.0).wall_s
        2.0
    """

    wall_s: float
    phases: tuple[PhaseTime, ...] = ()

    @property
    def accounted_s(self) -> float:
        """Seconds charged to a named phase."""
        return sum(p.seconds for p in self.phases)

    @property
    def other_s(self) -> float:
        """Seconds in no phase (planning, wrapping, bookkeeping)."""
        return max(0.0, self.wall_s - self.accounted_s)

    def seconds(self, phase: str, detail: str | None = None) -> float:
        """Seconds charged to ``phase`` (all its details, or only ``detail``)."""
        return sum(
            p.seconds
            for p in self.phases
            if p.phase == phase and (detail is None or p.detail == detail)
        )

    def table(self) -> str:
        """The phases, largest first, with their share of the wall time."""
        wall = self.wall_s or 1.0
        rows: list[list[Any]] = [
            [p.label, p.count, f"{p.seconds:.2f} s", f"{100 * p.seconds / wall:.1f}%"]
            for p in sorted(self.phases, key=lambda p: -p.seconds)
        ]
        rows.append([OTHER, "-", f"{self.other_s:.2f} s", f"{100 * self.other_s / wall:.1f}%"])
        rows.append(["total (wall)", "-", f"{self.wall_s:.2f} s", "100%"])
        return format_table(["phase", "times", "seconds", "share"], rows, title="tuning time")

    def __str__(self) -> str:
        return self.table()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (benchmarks store it)."""
        return {
            "wall_s": self.wall_s,
            "other_s": self.other_s,
            "phases": [
                {"phase": p.phase, "detail": p.detail, "seconds": p.seconds, "count": p.count}
                for p in self.phases
            ],
        }


class Stopwatch:
    """Charges every moment since its start to the innermost open phase (or to ``other``).

    Phases nest: time inside an inner phase is not charged to the outer one, so the recorded
    phases never count a second twice and add up to the wall time with ``other``.
    """

    def __init__(self) -> None:
        self.start = now()
        self._mark = self.start
        self._open: list[tuple[str, str]] = []
        self._seconds: dict[tuple[str, str], float] = {}
        self._counts: dict[tuple[str, str], int] = {}

    def _charge(self) -> None:
        t = now()
        if self._open:
            key = self._open[-1]
            self._seconds[key] = self._seconds.get(key, 0.0) + (t - self._mark)
        self._mark = t

    @contextlib.contextmanager
    def phase(self, name: str, detail: str = "") -> Iterator[None]:
        """Charge the block's time (less that of phases inside it) to ``name`` (``detail``)."""
        self._charge()
        key = (name, detail)
        self._open.append(key)
        self._counts[key] = self._counts.get(key, 0) + 1
        self._seconds.setdefault(key, 0.0)
        try:
            yield
        finally:
            self._charge()
            self._open.pop()

    def breakdown(self) -> TimeBreakdown:
        """The phases so far, in the order first entered, and the wall time since the start."""
        self._charge()
        phases = tuple(
            PhaseTime(name, detail, seconds, self._counts[(name, detail)])
            for (name, detail), seconds in self._seconds.items()
        )
        return TimeBreakdown(now() - self.start, phases)
