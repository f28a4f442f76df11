"""The JIT's background work: one supervisor thread runs every tune, off the serving path.

Each tune runs :func:`tunetree.auto_tune` on a private copy of the model (every module and
buffer copied, the parameters shared, never written), so the user's model is never wrapped,
hooked or put in eval mode by tuning, and callers keep being served by it meanwhile.

Where: a cold tune (builds expected) runs in a child process (:mod:`.child`) when the model
can be rebuilt there: a build's exports and conversions are Python, and in a thread of this
process they would hold the GIL that serving threads need (a call beside ``torch.export`` in
another thread waited seconds for it). The child writes its plan to the tuning cache, and the
supervisor loads that plan from the cache, as a second process would (nothing is built), and
checks it here. Otherwise (a model or ``call`` a fresh interpreter cannot unpickle, no cache
directory, or ``tuner_process=False``) the cold tune runs in a builder thread.

Priority: ``torch.set_num_threads`` is process-wide, so the tuner cannot take fewer threads
than serving without slowing serving too (and a tune measured on fewer threads would pick
for a machine the service does not run on); the child takes this process's thread count.
What Linux does allow is a nice value, per process and per thread, inherited by the threads
started after it (an OpenMP team, runtimes' pools, Inductor's compile workers). The child
process, or the builder thread, raises its own nice value (``tuner_nice``, default 10), so
serving threads get the cores first. Runtimes' worker threads made in a builder thread keep
that priority, so when a tuned plan comes out of it and the cache is on, the supervisor (at
the caller's priority) loads the plan again from the cache and that copy is the one served.

Randomness: torch's global generator is shared with the serving threads, so a background tune
neither saves nor restores it (:func:`tunetree.signature.rng.rng_left_alone`: restoring would
rewind what serving drew meanwhile) and must not draw from it. Tunetree's own random inputs have
their own generator; a model whose forward draws from the global one (checked once, on the
smallest recorded call, stopped before it draws) is left untuned with that reason.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import TunetreeError
from ..search.auto import auto_tune, budget_seconds
from ..search.auto_result import AutoTuneResult
from ..search.recorded import RecordedPlan, load_recorded
from ..signature.graph import Sample
from ..signature.modules import CallFn, private_copy, run_model
from ..signature.rng import global_draw, rng_left_alone
from .child import ChildJob, ChildTune, builds_of, remote_spec, why_not_in_child
from .recorder import tensor_bytes

log = logging.getLogger("tunetree.live")

DEFAULT_NICE = 10
THREAD_NAME = "tunetree-jit"
EXIT_WAIT_S = 10.0
"""At interpreter exit, how long the JIT's threads still at work are waited for."""


def _wait_at_exit() -> None:
    """Let background work end before the interpreter finalizes (bounded by EXIT_WAIT_S).

    A daemon thread still inside torch's native code when the interpreter finalizes can
    abort the process; a short job (keeping the calls, a warm load) ends well within this.
    """
    end = time.monotonic() + EXIT_WAIT_S
    for thread in threading.enumerate():
        if thread.name.startswith(THREAD_NAME) and thread is not threading.current_thread():
            thread.join(max(0.0, end - time.monotonic()))


atexit.register(_wait_at_exit)


@dataclass
class TuneJob:
    """One tune asked of the supervisor."""

    samples: list[Sample]
    generation: int
    why: str
    cold: bool = True
    """Builds are expected (traffic recorded here); False for a warm start from the cache."""
    builds: int = field(default=0, init=False)
    depth: int | None = None
    """For a warm start: the depth recorded with the calls (only it is loaded); else None."""
    recorded: RecordedPlan | None = None
    """For a warm start: the plan recorded with the calls (loaded as it is); else None."""
    untuned: str = field(default="", init=False)
    """Why a tune that ran elsewhere (a child process) left the model untuned."""


def lower_priority(nice: int) -> bool:
    """Raise the calling thread's nice value by ``nice`` (Linux: per thread); True if done."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as exc:
        log.debug("tt.jit: could not lower the tuner's priority: %s", exc)
        return False
    return True


class GlobalRandomDraws(TunetreeError):
    """The model's forward draws from torch's global random generator: not tuned beside serving."""


def check_no_global_draws(model: Any, samples: list[Sample], call: CallFn | None) -> None:
    """Run the smallest of ``samples`` on a private copy; raise if it would draw globally.

    Raises:
        GlobalRandomDraws: naming the first such operator (stopped before it drew).
    """
    smallest = min(samples, key=lambda s: tensor_bytes((s.args, s.kwargs)))
    mine = private_copy(model)
    try:
        found = global_draw(lambda: run_model(mine, smallest.own(), call))
    except Exception as exc:  # the tune itself will meet (and report) what failed here
        log.debug("tt.jit: the check for global random draws did not run: %s", exc)
        return
    if found:
        raise GlobalRandomDraws(
            f"the model's forward draws from torch's global random generator ({found}); a "
            "background tune would draw from the generator the serving threads use (tune it "
            "with tt.auto_tune, or give the forward a torch.Generator of its own)"
        )


Finish = Callable[[TuneJob, "AutoTuneResult | None", str], None]


class Tuner:
    """The supervisor thread (see the module docstring); ``finish`` gets every outcome."""

    def __init__(
        self,
        model: Any,
        call: CallFn | None,
        cache: Any,
        options: dict[str, Any],
        nice: int,
        finish: Finish,
        process: bool = True,
    ) -> None:
        self.model, self.call, self.cache = model, call, cache
        self.options, self.nice, self.finish = options, nice, finish
        self.process = process
        self._child: ChildTune | None = None
        self._stopped = False
        self._jobs: queue.SimpleQueue[TuneJob | Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False
        self._draws_checked = False

    def submit(self, job: TuneJob | Callable[[], None]) -> None:
        """Run a tune (or any callable, e.g. the warm lookup) on the supervisor thread.

        The thread is started for a burst of work and ends when the queue is empty, so
        nothing keeps a served model alive once its caller drops it.
        """
        self._jobs.put(job)
        with self._lock:
            if self._running:
                return
            self._running = True
        threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._running = False
                        return
                continue
            if isinstance(job, TuneJob):
                self._do(job)
            else:
                job()

    def _do(self, job: TuneJob) -> None:
        result, error = None, ""
        try:
            result = self._run(job)
        except Exception as exc:  # any failure leaves the model served eagerly
            error = f"{type(exc).__name__}: {exc}"
            log.debug("tt.jit: tuning failed\n%s", traceback.format_exc())
        try:
            self.finish(job, result, error)
        except Exception as exc:  # the supervisor must outlive any one tune
            log.warning("tt.jit: handling a finished tune failed: %s", exc)

    def _tune(self, samples: list[Sample], depth: int | None = None) -> AutoTuneResult:
        """auto_tune on a private copy; ``depth``: only that depth (a plan the cache holds)."""
        options = dict(self.options)
        if depth is not None:
            options.update(min_depth=depth, max_depth=depth)
        with rng_left_alone():  # serving threads own the global generator's progress
            return auto_tune(
                private_copy(self.model),
                samples,
                call=self.call,
                cache=self.cache,
                verbose=False,
                **options,
            )

    def _load(self, samples: list[Sample], plan: RecordedPlan) -> AutoTuneResult | None:
        """``plan`` from the cache on a private copy, checked against eager; None if it fails."""
        try:
            with rng_left_alone():
                return load_recorded(
                    private_copy(self.model),
                    samples,
                    plan,
                    cache=self.cache,
                    call=self.call,
                    options=self.options,
                )
        except Exception as exc:  # the plan is given up; the depth is tuned as before
            log.info("tt.jit: loading the recorded plan failed: %s: %s", type(exc).__name__, exc)
            log.debug("tt.jit: the recorded plan's load\n%s", traceback.format_exc())
            return None

    def stop(self) -> None:
        """Kill a child process still tuning (the served model no longer wants its plan)."""
        self._stopped = True
        child = self._child
        if child is not None:
            child.kill()

    def _run(self, job: TuneJob) -> AutoTuneResult | None:
        if not self._draws_checked:
            check_no_global_draws(self.model, job.samples, self.call)
            self._draws_checked = True
        self._stopped = False
        if job.cold and self.process:
            why_not = why_not_in_child(self.model, self.call, self.options, self.cache)
            if why_not is None:
                done, result = self._in_child(job)
                if done:
                    return result
            else:
                log.info("tt.jit: tuning in a thread of this process: %s", why_not)
        if not job.cold and job.recorded is not None:
            loaded = self._load(job.samples, job.recorded)
            if loaded is not None:
                return loaded
        if not job.cold or self.nice <= 0:
            result = self._tune(job.samples, job.depth)
            job.builds += builds_of(result)
            return result
        result = self._niced(job.samples)
        job.builds += builds_of(result)
        plan = RecordedPlan.of(result)
        if plan is None or self.cache in (None, False):
            return result
        # Load the plan again here, at the caller's priority: nothing to build or measure.
        again = self._load(job.samples, plan)
        if again is None:
            log.info("tt.jit: the tuned plan could not be loaded again; serving the tuned one")
            return result
        result.undo()
        return again

    def _in_child(self, job: TuneJob) -> tuple[bool, AutoTuneResult | None]:
        """The cold tune in a child process (:mod:`.child`), then its plan loaded here.

        Returns (done, result): not done when the child could not tune (the caller tunes in a
        thread); done with None when the child left the model untuned (``job.untuned`` says
        why).
        """
        spec = ChildJob(
            private_copy(self.model),
            job.samples,
            self.call,
            self.options,
            str(self.cache.directory),
            remote_spec(self.cache),
            torch.get_num_threads(),
            max(0, self.nice),
            logging.getLogger("tunetree").getEffectiveLevel(),
        )
        budget = budget_seconds(
            self.options.get("time_budget", "default"), bool(self.options.get("quick"))
        )
        self._child = ChildTune(spec, budget)
        try:
            outcome = self._child.run()
        finally:
            self._child = None
        job.builds += outcome.builds
        if self._stopped:
            return True, None
        if outcome.failed:
            log.info(
                "tt.jit: the child process did not tune (%s); tuning in a thread", outcome.reason
            )
            return False, None
        if outcome.depth is None:
            job.untuned = f"{outcome.reason} (tuned in a child process)"
            return True, None
        # The child's plan, from the cache, checked here (measured there). Failing that, only
        # its depth: searching again here would build, in this process, what the child skipped.
        loaded = self._load(job.samples, outcome.plan) if outcome.plan is not None else None
        if loaded is not None:
            return True, loaded
        result = self._tune(job.samples, outcome.depth)
        job.builds += builds_of(result)
        return True, result

    def _niced(self, samples: list[Sample]) -> AutoTuneResult:
        """A tune in a builder thread of lower priority; re-raises its exception."""
        out: dict[str, Any] = {}

        def build() -> None:
            lower_priority(self.nice)
            try:
                out["result"] = self._tune(samples)
            except BaseException as exc:
                out["error"] = exc

        thread = threading.Thread(target=build, name=f"{THREAD_NAME}-builder", daemon=True)
        thread.start()
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["result"]
