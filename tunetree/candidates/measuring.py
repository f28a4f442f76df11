"""Time a session's usable candidates: interleaved, screened, rematched, per shape."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext

from ..signature.graph import Sample
from ..signature.shapes import sizes_of
from .budget import MEASUREMENT, REMATCH, SCREENING, SHAPES, TIME_BUDGET_ERROR
from .decide import close_race, screen_out
from .measure import MeasureConfig, Timing, cycle_calls, measure
from .rows import CandidateRow, Status, short_error
from .state import SessionState

log = logging.getLogger(__name__)


class Measuring(SessionState):
    """The timing of a session's candidates (the decision itself is the strategy's)."""

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
            screening_s = self._least(config.screening(), len(usable))
            if not self.deadline.room_for_s(min(screening_s, self._least(config, len(usable)))):
                for row in usable:
                    row.status, row.reason = Status.SKIPPED, TIME_BUDGET_ERROR
                where = self.path or "<model>"
                self.progress(where, self.graph, f"measuring: {TIME_BUDGET_ERROR}")
                return
            short = not self.deadline.room_for_s(
                screening_s + self._least(config, min(len(usable), 2))
            )
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
        inform, so they are timed as briefly as screening (:meth:`.MeasureConfig.screening`):
        at full length they would be a large part of a ranged graph's tuning time.
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
                row.status, row.reason = Status.FAILED, f"measure: {short_error(one_exc)}"
        return timings
