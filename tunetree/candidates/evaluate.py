"""Build one candidate for one graph, check it against eager, and measure candidates.

A failing backend never breaks tuning: every outcome becomes a :class:`CandidateRow`
with a status and, when it is not usable, the reason.
"""

from __future__ import annotations

import enum
import functools
import logging
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from .._util.progress import Progress
from .._util.table import format_seconds
from ..accuracy import AccuracyBudget, output_error
from ..backends.base import Backend, Runner
from ..signature import parking
from ..signature.compare import Tolerances, compare_all
from ..signature.graph import Graph, Sample, batch_size, with_own_state
from ..signature.probes import checks
from ..signature.shapes import sizes_of
from ..signature.state import process_state_kept
from . import budget
from .budget import (
    BUILD,
    CHECK,
    MEASUREMENT,
    REMATCH,
    SCREENING,
    SHAPES,
    TIME_BUDGET_ERROR,
    BuildStopped,
    Deadline,
    Stopwatch,
    stopped_after,
)
from .build_costs import module_size
from .measure import MeasureConfig, Timing, cycle_calls, measure

log = logging.getLogger(__name__)
MIN_BUILD_S = 1.0
"""A build is never stopped sooner than this (the deadline's free time may be nearly gone)."""


class Status(str, enum.Enum):
    """What happened to a candidate."""

    OK = "ok"
    UNAVAILABLE = "unavailable"
    FAILED = "failed"
    REJECTED = "rejected"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value


@dataclass
class CandidateRow:
    """One backend's outcome on one graph."""

    backend: Backend
    status: Status
    reason: str = ""
    build_s: float | None = None
    max_abs_diff: float | None = None
    timing: Timing | None = None
    batch: int = 1
    max_batch_size: int | None = None
    runner: Runner | None = field(default=None, repr=False, compare=False)
    per_shape: dict[str, Timing] = field(default_factory=dict, repr=False)
    """Latency per recorded shape of a ranged graph (winner and eager; see
    :meth:`GraphSession.measure_shapes`), by the sizes of its dimensions."""
    error: float | None = None
    """Error on the graph's samples in the accuracy budget's module metric (tuned with a
    budget only; see :class:`tunetree.AccuracyBudget`)."""
    screened_out: bool = False
    """Dropped by the screening measurement: it could not be within the margin of the leader
    (its ``timing`` is the screening's; it takes no part in the choice)."""

    @property
    def latency_s(self) -> float | None:
        """Median latency of the candidate, or None when not measured."""
        return self.timing.median_s if self.timing else None

    @property
    def throughput(self) -> float | None:
        """Samples per second at the measured batch size."""
        return self.batch / self.timing.median_s if self.timing else None

    @property
    def usable(self) -> bool:
        """True when the candidate's status is OK and it has a runner."""
        return self.status is Status.OK and self.runner is not None

    def describe(self) -> str:
        """Status and reason in one cell."""
        note = "" if self.backend.preserves_results else " (changes results, opt-in)"
        return f"{self.status}{note}" + (f": {self.reason}" if self.reason else "")

    def latency_text(self) -> str:
        """The measured latency as the table shows it."""
        return str(self.timing) if self.timing else format_seconds(None)


class Verdict(NamedTuple):
    """How a candidate's outputs of a graph's samples compare with eager's."""

    reason: str
    """Why they are not acceptable ("" when they are)."""
    max_abs_diff: float
    """The largest absolute difference from eager's."""
    error: float | None
    """Under an accuracy budget, the largest error in its module metric (else None)."""


class RunError(Exception):
    """A runner raised on a recorded sample (its candidate's row says ``run: ...``)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass
class GraphSession:
    """Everything a strategy needs to evaluate candidates for one graph of one module."""

    module: nn.Module
    path: str
    graph: Graph
    device: torch.device
    tolerances: Tolerances = field(default_factory=Tolerances)
    measure_config: MeasureConfig = field(default_factory=MeasureConfig)
    progress: Progress = field(default_factory=lambda: Progress(False))
    on_build: Callable[[Backend], None] | None = None
    """Called before every backend build (the cache and tests count builds with it)."""
    measure_lock: Callable[[], AbstractContextManager[None]] | None = None
    """Held around every measurement when set: the tuning cache supplies its device lock on
    a miss so concurrent tuners do not disturb each other's timings. Sessions derived from
    this one (``dataclasses.replace``) keep it."""
    deadline: Deadline | None = None
    """When set, a candidate (other than eager) whose build is not expected to end before it is
    skipped without a build, measurements stop at it, and one with no time left is skipped."""
    clock: Stopwatch = field(default_factory=Stopwatch, repr=False)
    """Where builds, checks and measurements charge their time (the result's breakdown)."""
    usable_built: int = field(default=0, repr=False)
    """Candidates built and checked correct so far (what a measurement would time)."""
    usable_others: int = field(default=0, repr=False)
    """Of those, the ones other than eager: until one is, a build may use more than its
    graph's share of the budget (see :meth:`Deadline.room_to_build`)."""
    call_s: float = 0.0
    """About one eager call of this graph (from the inspection): how long measurements take."""
    accuracy: AccuracyBudget | None = None
    """When set, results-changing candidates are admitted by their error in the budget's module
    metric (at most :attr:`AccuracyBudget.module_limit`) instead of their tolerances, and every
    row records its error."""

    def evaluate(self, backend: Backend) -> CandidateRow:
        """Availability, build and first run, then comparison with eager on every sample."""
        where = self.path or "<model>"
        reason = backend.unavailable_reason(self.device)
        if reason:
            return CandidateRow(backend, Status.UNAVAILABLE, reason)
        if backend.kind != "eager" and not self._room_to_build(backend):
            return CandidateRow(backend, Status.SKIPPED, TIME_BUDGET_ERROR)
        self.progress(where, self.graph, backend.name, "building")
        if self.on_build is not None:
            self.on_build(backend)
        timed = self.deadline.build(backend.kind) if self.deadline is not None else nullcontext()
        with timed:
            start, clock_start = time.perf_counter(), budget.now()
            try:
                with (
                    self._stopped_at_deadline(backend),
                    self.clock.phase(BUILD, backend.kind),
                    process_state_kept(f"building {backend.name} for {where}"),
                ):
                    built = self._build_and_run(backend)
            except BuildStopped:
                spent = time.perf_counter() - start
                self._record_build(backend, budget.now() - clock_start, stopped=True)
                log.info(
                    "%s: %s's build stopped after %.1f s: %s",
                    where,
                    backend,
                    spent,
                    TIME_BUDGET_ERROR,
                )
                self.progress(where, self.graph, backend.name, f"stopped: {TIME_BUDGET_ERROR}")
                return CandidateRow(backend, Status.SKIPPED, TIME_BUDGET_ERROR)  # not built
            build_s = time.perf_counter() - start
            self._record_build(
                backend, budget.now() - clock_start, completed=not isinstance(built, CandidateRow)
            )
            if isinstance(built, CandidateRow):
                return built
            with self.clock.phase(CHECK, backend.kind):
                row = self._checked(backend, *built, build_s)
            if row.usable and backend.kind != "eager":
                self.usable_others += 1
            return row

    @functools.cached_property
    def size(self) -> int:
        """The graph's size as build times grow with it: the modules the built module holds."""
        return module_size(self.module)

    def _record_build(
        self, backend: Backend, seconds: float, completed: bool = False, stopped: bool = False
    ) -> None:
        """Tell the deadline's :class:`BuildCosts` what ``backend``'s build took here.

        ``completed``: it produced a runner; ``stopped``: the budget stopped it.
        """
        if self.deadline is not None and backend.kind != "eager":
            self.deadline.costs.record(
                backend.name, self.size, seconds, backend.build_prior_s(), completed, stopped
            )

    def expected_build_s(self, backend: Backend) -> float:
        """How long ``backend``'s build of this graph is expected to take (0 without a budget)."""
        if self.deadline is None or backend.kind == "eager":
            return 0.0
        return self.deadline.expected_build_s(backend.name, self.size, backend.build_prior_s())

    def build_order(self, backends: list[Backend]) -> list[Backend]:
        """``backends`` in the order to build them: under a time budget, cheapest per win first.

        Expected build seconds over the chance to win (:meth:`BuildCosts.cost_per_win`), ties
        in the given order; eager, which costs nothing to build, last. Without a budget, as
        given.
        """
        if self.deadline is None:
            return list(backends)
        costs, size = self.deadline.costs, self.size
        others = [b for b in backends if b.kind != "eager"]
        eager = [b for b in backends if b.kind == "eager"]
        others.sort(key=lambda b: costs.cost_per_win(b.name, size, b.build_prior_s()))
        return others + eager

    def _stopped_at_deadline(self, backend: Backend) -> AbstractContextManager[None]:
        """Stop a build (other than eager's) still running when its share of the budget ends.

        Its graph's share (:meth:`Deadline.build_cap_s`): the graph's first candidate besides
        eager may take longer, never past the budget's free time, after which its candidate
        could not be measured any more. A backend whose builds must not be interrupted
        (``stoppable_build`` False) is only kept from starting (:meth:`_room_to_build`).
        """
        if self.deadline is None or backend.kind == "eager" or not backend.stoppable_build:
            return nullcontext()
        measuring = self._least(self.measure_config.screening(), self.usable_built + 2)
        expected = self.expected_build_s(backend)
        cap = self.deadline.build_cap_s(expected, not self.usable_others, measuring)
        return stopped_after(max(cap, MIN_BUILD_S))

    def _room_to_build(self, backend: Backend) -> bool:
        """Whether the deadline has room for ``backend``'s build and then a short measurement.

        Within the graph's share of the budget, unless no candidate besides eager is usable
        yet (:meth:`Deadline.room_to_build`).

        The short measurement is that of the candidates usable so far, this one and one more (eager
        comes last): a build whose candidate cannot be measured any more is wasted.
        """
        if self.deadline is None:
            return True
        measuring = self._least(self.measure_config.screening(), self.usable_built + 2)
        expected = self.expected_build_s(backend)
        return self.deadline.room_to_build(expected, measuring, first=not self.usable_others)

    def _least(self, config: MeasureConfig, candidates: int) -> float:
        """About the shortest measurement of ``candidates`` of this graph with ``config``."""
        return config.least_s(candidates, self.call_s, len(self.graph.samples))

    def _checked(
        self, backend: Backend, runner: Runner, verdict: Verdict, build_s: float
    ) -> CandidateRow:
        """The row of a built candidate: rejected unless its outputs and probes match eager.

        Under an accuracy budget a results-changing candidate matches when its error is within
        the budget's module limit.
        """
        reason, max_diff, error = verdict
        if not reason:
            reason = self.probe_failure(runner) or ""
            runner.end_checks()  # what it built for the probes alone may go
        if reason:
            return CandidateRow(backend, Status.REJECTED, reason, build_s, max_diff, error=error)
        self.usable_built += 1
        return CandidateRow(
            backend,
            Status.OK,
            build_s=build_s,
            max_abs_diff=max_diff,
            batch=batch_size(self.graph.samples[0]),
            runner=runner,
            error=error,
        )

    def judge(
        self, backend: Backend, outputs: list[Any], references: list[Any] | None = None
    ) -> tuple[str, float, float | None]:
        """Whether ``backend``'s outputs of the graph's samples are acceptable.

        With ``references`` (eager's outputs of other calls: probes) the outputs are of those
        calls. Returns why not ("" when they are), the largest absolute difference from eager
        and, under an accuracy budget, the error in its module metric.
        """
        if references is None:
            references = [parking.reference(self.graph, i) for i in range(len(outputs))]
        error = None
        if self.accuracy is not None:
            error = output_error(references, outputs, self.accuracy.module_metric)
        if self._budgeted(backend):
            return self._over_limit(error), output_error(references, outputs, "max_abs"), error
        comparison = compare_all(references, outputs, self._tolerances(backend))
        return ("" if comparison.ok else comparison.reason), comparison.max_abs_diff, error

    def _budgeted(self, backend: Backend) -> bool:
        """Whether ``backend`` is admitted by the accuracy budget rather than by tolerances."""
        return self.accuracy is not None and not backend.preserves_results

    def _tolerances(self, backend: Backend) -> Tolerances:
        return backend.tolerances() or self.tolerances

    def _over_limit(self, error: float | None) -> str:
        """Why ``error`` breaks the budget's module limit ("" when it does not)."""
        assert self.accuracy is not None
        limit = self.accuracy.module_limit
        if error is not None and error <= limit:
            return ""
        return (
            f"{self.accuracy.module_metric} error {error:.3g} on this module's outputs is over "
            f"the budget's module limit {limit:g}"
        )

    def _build_and_run(self, backend: Backend) -> tuple[Runner, Verdict] | CandidateRow:
        """Build ``backend``'s runner, run it on every sample and judge its outputs.

        A failure to build or to run is a row.
        """
        try:
            runner = backend.build(self.module, with_own_state(self.graph), self.device)
        except Exception as exc:  # any backend error becomes a row
            return self._failed(backend, "build", exc)
        try:
            verdict = self.run_judged(backend, runner)
        except RunError as exc:
            return self._failed(backend, "run", exc.cause)
        return runner, verdict

    def run_judged(self, backend: Backend, runner: Runner) -> Verdict:
        """``runner`` run on every recorded sample, each output judged as it comes.

        Only one candidate output is alive at a time: a decode step's output holds the whole
        cache, and keeping every sample's copy until all had run made those copies a large part
        of tuning's peak device memory. The verdict is that of :meth:`judge` over all samples:
        the first mismatch decides (its sample named), the largest difference and, under an
        accuracy budget, the largest error. Raises :class:`RunError` when the runner fails.
        """
        samples = self.graph.samples
        if len(samples) != len(self.graph.outputs):
            raise ValueError(f"{len(samples)} samples but {len(self.graph.outputs)} outputs")
        reason, worst, error = "", 0.0, None
        for i, sample in enumerate(samples):
            try:
                with torch.no_grad():
                    output = sample.run(runner)
            except Exception as exc:
                raise RunError(exc) from exc
            # Back from host memory one at a time, and only once the run is over: alive during
            # it, eager's output (a decode step's whole cache) was 0.1 GiB of Llama-0.5B's peak.
            reference = parking.reference(self.graph, i)
            wrong, diff, err = self.judge(backend, [output], [reference])
            del output, reference
            worst = max(worst, diff)
            if err is not None:
                error = err if error is None else max(error, err)
            if wrong and not reason:
                reason = (f"sample {i}: " if len(samples) > 1 else "") + wrong
                if self.accuracy is None:
                    break  # nothing more to learn: the first mismatch rejects it
        if self._budgeted(backend):
            reason = self._over_limit(error)
        return Verdict(reason, worst, error)

    def _failed(self, backend: Backend, stage: str, exc: Exception) -> CandidateRow:
        """The row of a failed candidate; one log line says why, the debug log all of it."""
        reason = f"{stage}: {_short(exc)}"
        log.info("%s: %s failed: %s", self.path or "<model>", backend.name, reason)
        log.debug("%s of %s failed:\n%s", stage, backend.name, traceback.format_exc())
        return CandidateRow(backend, Status.FAILED, reason)

    def probe_failure(self, runner: Runner) -> str | None:
        """Why ``runner`` is wrong on a probe call of this graph (:mod:`.probes`), or None.

        Probes are the range ends, an odd size between them and value probes; they are compared
        with the runner's backend's tolerances (under an accuracy budget, a results-changing
        backend with the module limit). Eager is the reference and is not probed.
        """
        if runner.backend.kind == "eager":
            return None
        for probe in checks(self.module, self.graph):
            try:
                with torch.no_grad():
                    got = probe.run(runner)
            except Exception as exc:
                return f"fails on {probe.label}: {_short(exc, 200)}"
            # Eager's output comes back only now, and each output goes before the next probe:
            # a decode step's output is its whole cache.
            wrong, _, _ = self.judge(runner.backend, [got], [probe.expected()])
            label = probe.label
            del got, probe
            if wrong:
                return f"wrong on {label}: {wrong}"
        return None

    def measure(self, rows: list[CandidateRow], screen: bool = False) -> None:
        """Time every usable row, interleaved, and store each row's :class:`Timing`.

        With ``screen`` (strategies where the fastest wins) and three or more usable rows, a
        short screening measurement first drops the rows that cannot be within
        ``MeasureConfig.screen_margin`` of the leader (``screened_out``); when one row is
        left, its screening timing decides. When the deadline leaves time for the short
        measurement only, it decides; when it leaves none, the rows are skipped (the graph
        keeps its forward).
        """
        usable = [r for r in rows if r.usable]
        if not usable:
            return
        config, short = self.measure_config, False
        if self.deadline is not None:
            quick = self._least(config.screening(), len(usable))
            if not self.deadline.room_for_s(min(quick, self._least(config, len(usable)))):
                for row in usable:
                    row.status, row.reason = Status.SKIPPED, TIME_BUDGET_ERROR
                where = self.path or "<model>"
                self.progress(where, self.graph, f"measuring: {TIME_BUDGET_ERROR}")
                return
            short = not self.deadline.room_for_s(quick + self._least(config, min(len(usable), 2)))
        self.progress(self.path or "<model>", self.graph, f"measuring {len(usable)} candidates")
        calls: dict[str, Callable[[], object]] = {}
        for i, row in enumerate(usable):
            assert row.runner is not None
            calls[f"{i}"] = cycle_calls(row.runner, self.graph.samples)
        with self.measure_lock() if self.measure_lock is not None else nullcontext():
            if short or (screen and config.screen and len(usable) >= 3):
                calls = self._screen(usable, calls, drop=screen and config.screen)
                if short or len(calls) < 2:
                    return
            with self.clock.phase(MEASUREMENT):
                timings = self._time(calls, usable, config)
            for name, timing in timings.items():
                usable[int(name)].timing = timing
            if config.rematch:
                self._rematch(usable, calls)

    def _screen(
        self, usable: list[CandidateRow], calls: dict[str, Callable[[], object]], drop: bool
    ) -> dict[str, Callable[[], object]]:
        """Time every row briefly; with ``drop``, mark those that cannot win.

        Returns the calls of the rows still in the race.
        """
        with self.clock.phase(SCREENING):
            timings = self._time(calls, usable, self.measure_config.screening())
        for name, timing in timings.items():
            usable[int(name)].timing = timing
        timed = [usable[int(name)] for name in timings]
        dropped = screen_out(timed, self.measure_config.screen_margin) if drop else []
        if dropped:
            self.progress(
                self.path or "<model>",
                self.graph,
                "screened out: " + ", ".join(r.backend.name for r in dropped),
            )
        out = {id(r) for r in dropped}
        return {
            n: fn
            for n, fn in calls.items()
            if n in timings and id(usable[int(n)]) not in out and usable[int(n)].usable
        }

    def _rematch(self, usable: list[CandidateRow], calls: dict[str, Callable[[], object]]) -> None:
        """Time again the candidates whose spread overlaps the fastest one's (a close race)."""
        finalists = close_race([usable[int(n)] for n in calls])
        if len(finalists) < 2:
            return
        if self.deadline is not None and not self.deadline.room_for_s(
            self._least(self.measure_config, len(finalists))
        ):
            return
        chosen = {id(row) for row in finalists}
        names = [n for n in calls if id(usable[int(n)]) in chosen]
        self.progress(
            self.path or "<model>",
            self.graph,
            "close race, measuring again: " + ", ".join(r.backend.name for r in finalists),
        )
        with self.clock.phase(REMATCH):
            again = self._time({n: calls[n] for n in names}, usable, self.measure_config.longer())
        for name, timing in again.items():
            usable[int(name)].timing = timing

    def measure_shapes(self, rows: list[CandidateRow]) -> None:
        """For a ranged graph, time ``rows`` on each recorded shape apart (``per_shape``).

        The mean over the mix stays in ``timing``, and decided the winner: these figures only
        inform, so they are timed as briefly as screening (:meth:`.MeasureConfig.screening`).
        At full length they took 37 % of a Llama's tuning on the H200 (43 s of 118 s).
        """
        shapes: dict[str, list[Sample]] = {}
        for sample in self.graph.samples:
            sizes = sizes_of(sample, self.graph.key)
            label = ", ".join(f"{n}={v}" for n, v in sorted(sizes.items()))
            shapes.setdefault(label, []).append(sample)
        usable = [r for r in rows if r.usable]
        if len(shapes) < 2 or not usable:
            return
        calls: dict[str, Callable[[], object]] = {}
        for i, row in enumerate(usable):
            assert row.runner is not None
            for label, samples in shapes.items():
                calls[f"{i}|{label}"] = cycle_calls(row.runner, samples)
        config = self.measure_config.screening()
        least = self._least(config, len(calls))
        if self.deadline is not None and not self.deadline.room_for_s(least):
            return  # informative only: not worth the budget's last seconds
        lock = self.measure_lock() if self.measure_lock is not None else nullcontext()
        with lock, self.clock.phase(SHAPES):
            try:
                timings = measure(calls, self.device, config, self.deadline)
            except Exception as exc:
                log.debug("per-shape measurement failed: %s", exc)
                return
        for name, timing in timings.items():
            index, label = name.split("|", 1)
            usable[int(index)].per_shape[label] = timing

    def _time(
        self,
        calls: dict[str, Callable[[], object]],
        usable: list[CandidateRow],
        config: MeasureConfig,
    ) -> dict[str, Timing]:
        """Interleaved timings; one by one when a runner fails only when timed."""
        try:
            return measure(calls, self.device, config, self.deadline)
        except Exception as exc:
            log.debug("interleaved measurement failed: %s", exc)
        timings: dict[str, Timing] = {}
        for name, fn in calls.items():
            try:
                timings.update(measure({name: fn}, self.device, config, self.deadline))
            except Exception as one_exc:
                row = usable[int(name)]
                row.status, row.reason = Status.FAILED, f"measure: {_short(one_exc)}"
        return timings


def _per_sample(row: CandidateRow, value: float) -> float:
    """``value`` (a time per call) per sample of the row's batch."""
    return value / max(row.batch, 1)


def _timed_and_leader(rows: list[CandidateRow]) -> tuple[list[CandidateRow], CandidateRow] | None:
    """The usable timed rows and the fastest of them (per sample); None for fewer than two."""
    timed = [r for r in rows if r.usable and r.timing is not None]
    if len(timed) < 2:
        return None
    leader = min(timed, key=lambda r: _per_sample(r, r.timing.median_s))  # type: ignore[union-attr]
    return timed, leader


def close_race(rows: list[CandidateRow]) -> list[CandidateRow]:
    """The usable, timed rows whose spread (time per sample) overlaps the fastest row's.

    Empty when there is no race: fewer than two such rows. The fastest row is always among
    them otherwise.
    """
    found = _timed_and_leader(rows)
    if found is None:
        return []
    timed, best = found
    assert best.timing is not None
    limit = _per_sample(best, best.timing.q3_s)
    finalists = [r for r in timed if _per_sample(r, r.timing.q1_s) <= limit]  # type: ignore[union-attr]
    return finalists if len(finalists) >= 2 else []


def screen_out(rows: list[CandidateRow], margin: float) -> list[CandidateRow]:
    """The timed rows that cannot be within ``margin`` of the fastest one; marks them.

    A row cannot be when even its fastest quarter of blocks (per sample) is slower than the
    leader's slowest quarter by more than ``margin``: more trials would not make it the winner.
    """
    found = _timed_and_leader(rows)
    if found is None:
        return []
    timed, leader = found
    assert leader.timing is not None
    limit = _per_sample(leader, leader.timing.q3_s) * (1 + margin)
    dropped = []
    for row in timed:
        assert row.timing is not None
        if _per_sample(row, row.timing.q1_s) > limit:
            row.screened_out = True
            ratio = _per_sample(row, row.timing.median_s) / _per_sample(
                leader, leader.timing.median_s
            )
            row.reason = f"screened out: {ratio:.2f}x the leader ({leader.backend.name})"
            dropped.append(row)
    return dropped


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
