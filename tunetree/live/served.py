""":class:`Served`: the model as the JIT serves it, eager first, tuned once a plan is ready.

Every call runs whatever is being served right now: the model itself until a tuned plan has
been checked, then the tuned copy. The swap is one attribute assignment (a call reads the
pair ``(model, watch)`` once), so concurrent callers each run either the whole old model or
the whole new one, never a mix. What can go wrong here (recording, tuning) ends in eager
serving with a reason, never in an exception the model itself would not raise.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..runtime.wrap import dispatcher_of
from ..search.auto_result import AutoTuneResult
from ..search.recorded import RecordedPlan
from ..signature.graph import GraphKey, Sample
from ..signature.modules import CallFn, module_paths
from .recorder import Recorder
from .tuner import TuneJob, Tuner

log = logging.getLogger("tunetree.live")

RECORDING, TUNING, TUNED, UNTUNED = "recording", "tuning", "tuned", "untuned"


class Watch:
    """Counts the served calls a tuned model ran outside its plan (the original forward)."""

    def __init__(self, model: Any) -> None:
        found = (dispatcher_of(m) for _, m in module_paths(model))
        self.dispatchers = [d for d in found if d is not None]
        self.inside = 0
        self.outside = 0

    def fallbacks(self) -> int:
        """Original-forward calls of every wrapped module so far."""
        return sum(d.fallback_calls for d in self.dispatchers)


class Served:
    """A model served eagerly while the JIT records and tunes, then tuned; see :func:`jit`.

    Attributes:
        model: the model given to ``tt.jit`` (never changed by tuning).
        status: ``"recording"``, ``"tuning"``, ``"tuned"`` or ``"untuned"``.
        reason: why it is in that status, in words.
        tunes: tunes finished so far (a re-tune for wider ranges counts too).
        builds: candidates built by this process's tunes (0 on a warm start).
        tuned_on: the calls the last finished tune ran on (what a warm start reads back).
    """

    def __init__(self, model: Any, call: CallFn | None, recorder: Recorder) -> None:
        self.model = model
        self.call = call
        self.recorder = recorder
        self.status, self.reason = RECORDING, "recording calls"
        self.tunes = 0
        self.builds = 0
        self.tuned_on: list[Sample] = []
        self.tuner: Tuner | None = None
        self.persist: Any = None
        """Called with the samples of a tuned plan (keeps them in the cache); None: not kept."""
        self._serving: tuple[Any, Watch | None] = (model, None)
        self._recording = True
        self._busy = False
        self._persisting = False
        self._want = False
        self._retune = True
        self._generation = 0
        self._result: AutoTuneResult | None = None
        self._warned: set[str] = set()
        self._state = threading.Condition()

    # ------------------------------------------------------------------ serving

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run one call as the model would (same arguments, same outputs)."""
        if getattr(self.model, "training", False):
            self._give_up("the model is in training mode (tuned runners serve eval mode only)")
            return self._invoke(self.model, args, kwargs)
        target, watch = self._serving
        if self._recording:
            self._record(args, kwargs)
        if watch is None:
            return self._invoke(target, args, kwargs)
        before = watch.fallbacks()
        out = self._invoke(target, args, kwargs)
        if watch.fallbacks() > before:
            self._outside(watch, args, kwargs)
        else:
            watch.inside += 1
        return out

    def _invoke(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.call is None:
            return target(*args, **kwargs)
        return self.call(target, *args, **kwargs)

    def _record(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            key = GraphKey.of(args, kwargs)
            if key.has_opaque:
                self._give_up(f"a call holds an object that cannot be keyed ({key})")
                return
            self.recorder.offer(key, args, kwargs)
        except Exception as exc:  # never the caller's problem: serve eagerly
            self._give_up(f"recording a call failed: {type(exc).__name__}: {exc}")
            return
        if not self._busy and (self._want or self.recorder.ready()):
            self._start("traffic")

    def _outside(self, watch: Watch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A call outside the tuned plan: recorded; enough of them start a re-tune."""
        watch.outside += 1
        limits = self.recorder.limits
        if Sample(args, kwargs).stateful:  # its state changed during the call: not recorded
            return
        try:
            key = GraphKey.of(args, kwargs)
            if not key.has_opaque:
                self.recorder.offer(key, args, kwargs)
        except Exception as exc:
            log.debug("tt.jit: an outside call was not recorded: %s", exc)
            return
        share = watch.outside / (watch.inside + watch.outside)
        if (
            self._retune
            and watch.outside >= limits.retune_min_calls
            and share >= limits.retune_share
        ):
            watch.inside = watch.outside = 0
            self._start(f"{share:.0%} of calls ran outside the tuned ranges")

    # ------------------------------------------------------------------ state

    def _start(self, why: str, cold: bool = True) -> None:
        """Hand the recorded calls to the tuner (once at a time)."""
        with self._state:
            samples = self.recorder.samples()
            if self._busy or self.tuner is None or not samples:
                self._want = self._want or (self.tuner is not None and not samples)
                return
            self._busy, self._want = True, False
            if self.status != TUNED:
                self.status = TUNING
            self.reason = f"tuning on {len(samples)} recorded calls ({why})"
            job = TuneJob(samples, self._generation, why, cold)
        log.info("tt.jit: %s", self.reason)
        self.tuner.submit(job)

    def _give_up(self, reason: str, warn: bool = True) -> None:
        """Serve the model itself from now on, with ``reason``; one warning per reason."""
        with self._state:
            self._generation += 1
            self._serving = (self.model, None)
            self._recording = self._busy = False
            self.status, self.reason, self._result = UNTUNED, reason, None
            self._state.notify_all()
        if self.tuner is not None:
            self.tuner.stop()  # a child process still building has nothing left to build for
        if warn and reason not in self._warned:
            self._warned.add(reason)
            log.warning("tt.jit: serving the model's own forward: %s", reason)

    def finish(self, job: TuneJob, result: AutoTuneResult | None, error: str) -> None:
        """The tuner's outcome: swap the tuned model in, or serve eagerly with the reason."""
        with self._state:
            if job.generation != self._generation:  # undone (or given up) meanwhile
                if result is not None:
                    result.undo()
                return
            self.builds += job.builds
            self.tunes += 1
            self.tuned_on = job.samples
        if error or result is None or result.depth is None:
            if result is not None:
                log.debug("tt.jit: the tune that left the model untuned:\n%s", result)
            why = job.untuned or (
                f"tuning failed: {error}"
                if error or result is None
                else f"no plan was faster than the model's own forward on {len(job.samples)} "
                "recorded calls"
            )
            if self._serving[1] is not None:  # a re-tune: keep the plan that serves now
                self._keep(why)
            else:
                self._give_up(why)
            return
        speedup = result.speedup
        keep = self.persist is not None and job.cold  # a warm start read them from there
        with self._state:
            self._result = result
            self._serving = (result.model, Watch(result.model))  # the swap: one assignment
            self._recording, self._busy = False, False
            self._persisting = keep  # wait() returns once the calls are kept
            self.status = TUNED
            self.reason = (
                f"depth {result.depth}, {speedup:.2f}x the model's own forward on "
                f"{len(job.samples)} recorded calls ({job.why}; {job.builds} builds)"
            )
            self.recorder.mark()
            self._state.notify_all()
        log.info("tt.jit: swapped in the tuned model: %s", self.reason)
        if keep:
            _keep_calls(self, job.samples, result)

    def _keep(self, why: str) -> None:
        """A re-tune came to nothing: the current plan serves on, no more re-tunes by traffic."""
        with self._state:
            self._busy, self._retune = False, False
            self.status, self.reason = TUNED, f"still serving the earlier plan ({why})"
            self._state.notify_all()
        log.warning("tt.jit: %s", self.reason)

    def looking(self) -> None:
        """A warm lookup is under way: no tune starts before it ends."""
        with self._state:
            self._busy = True
            self.reason = "looking for calls recorded in the cache for this model"

    def not_found(self) -> None:
        """The warm lookup found nothing: go on recording."""
        with self._state:
            if self.status != RECORDING:  # given up or undone meanwhile
                return
            self._busy = False
            self.reason = "recording calls (none recorded in the cache for this model)"
        if self.recorder.ready():
            self._start("traffic")

    def warm(
        self, samples: list[Sample], where: str, depth: int | None, plan: RecordedPlan | None
    ) -> TuneJob | None:
        """A warm start's job on calls read from the cache at ``where`` (None if given up)."""
        with self._state:
            if self.status != RECORDING:  # given up or undone meanwhile
                return None
            self.recorder.replace(samples)
            self.status = TUNING
            self.reason = (
                f"loading the plan tuned on {len(samples)} calls recorded in the {where} cache"
            )
            log.info("tt.jit: %s", self.reason)
            why = f"warm start, {where} cache"
            return TuneJob(samples, self._generation, why, cold=False, depth=depth, recorded=plan)

    # ------------------------------------------------------------------ public

    @property
    def result(self) -> AutoTuneResult | None:
        """The :class:`~tunetree.AutoTuneResult` of the plan served, or None."""
        return self._result if self.status == TUNED else None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until tuned or untuned (or ``timeout`` seconds); returns True when tuned.

        A re-tune in progress is waited for too. While fewer calls than needed were recorded,
        this waits for more calls (or :meth:`tune_now`).
        """
        with self._state:
            self._state.wait_for(self._settled, timeout)
            return self.status == TUNED

    def _settled(self) -> bool:
        return self.status in (TUNED, UNTUNED) and not self._busy and not self._persisting

    def tune_now(self) -> None:
        """Tune on the calls recorded so far now (or at the next call when none are)."""
        with self._state:
            if self.status == UNTUNED:
                self._recording = True
                self.status, self.reason = RECORDING, "recording calls (tune_now)"
        self._want = self._retune = True
        self._start("tune_now")

    def undo(self) -> Any:
        """Serve the plain model from now on (no recording, no tuning); returns it."""
        self._give_up("undone: serving the plain model", warn=False)
        return self.model

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or "model" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["model"], name)

    def __repr__(self) -> str:
        return (
            f"Served({type(self.model).__name__}, status={self.status!r}, reason={self.reason!r})"
        )


def _keep_calls(served: Served, samples: list[Sample], result: AutoTuneResult) -> None:
    """Keep the calls a plan was tuned on (and the plan) in the cache; then wait() may end."""
    try:
        served.persist(samples, result.depth, RecordedPlan.of(result))
    finally:
        with served._state:
            served._persisting = False
            served._state.notify_all()
