"""Build one candidate for one graph under the time budget, then check it.

A failing backend never breaks tuning: every outcome becomes a :class:`~.rows.CandidateRow`
with a status and, when it is not usable, the reason.
"""

from __future__ import annotations

import functools
import logging
import time
import traceback
from contextlib import AbstractContextManager, nullcontext

from ..backends.base import Backend, Runner
from ..signature.graph import batch_size, with_own_state
from ..signature.state import process_state_kept
from . import budget
from .budget import (
    BUILD,
    CHECK,
    TIME_BUDGET_ERROR,
    BuildStopped,
    stopped_after,
)
from .build_costs import module_size
from .checking import Checking
from .rows import CandidateRow, RunError, Status, Verdict, short_error

log = logging.getLogger(__name__)
MIN_BUILD_S = 1.0
"""A build is never stopped sooner than this (the deadline's free time may be nearly gone)."""


class Building(Checking):
    """The build of a session's candidates: availability, budget room, build, first run, check."""

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

    def _failed(self, backend: Backend, stage: str, exc: Exception) -> CandidateRow:
        """The row of a failed candidate; one log line says why, the debug log all of it."""
        reason = f"{stage}: {short_error(exc)}"
        log.info("%s: %s failed: %s", self.path or "<model>", backend.name, reason)
        log.debug("%s of %s failed:\n%s", stage, backend.name, traceback.format_exc())
        return CandidateRow(backend, Status.FAILED, reason)
