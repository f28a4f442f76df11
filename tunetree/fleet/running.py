"""Run placed jobs as Ray actors, hold each to its time limit, gather one row per job.

Every job gets its own actor (:class:`~tunetree.fleet.worker.JobWorker`, one process on its
node). Its clock starts when the actor answers that it is ready, so waiting for a free node
and starting the worker are not counted. A job past its limit becomes a ``timed out`` row
and its actor is killed (its process ends, whatever it was doing); every other job's row
still comes back. Each actor is killed once its row is in, so it holds neither its CPUs nor
its threads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .job import Job
from .report import FleetRow

log = logging.getLogger(__name__)


@dataclass
class RunningJob:
    """One submitted job: its actor, its pending calls, and when it started."""

    index: int
    job: Job
    actor: Any
    started_ref: Any
    row_ref: Any
    limit_s: float | None
    started: float | None = None
    node: str = ""
    waiting: set[Any] = field(default_factory=set)

    def overdue(self, now: float) -> bool:
        """Whether the job has run past its limit."""
        return (
            self.started is not None
            and self.limit_s is not None
            and now > self.started + self.limit_s
        )

    def left_s(self, now: float) -> float | None:
        """Seconds until its limit (None: no limit, or not started)."""
        if self.started is None or self.limit_s is None:
            return None
        return self.started + self.limit_s - now


def submit(ray: Any, worker: Any, index: int, job: Job, cpus: float, *args: Any) -> RunningJob:
    """Start ``job``'s actor (``worker`` is the Ray actor class) and queue its run."""
    actor = worker.options(**job.ray_options(cpus)).remote()
    running = RunningJob(
        index, job, actor, actor.ready.remote(job), actor.run.remote(job, *args), job.limit_s()
    )
    running.waiting = {running.started_ref, running.row_ref}
    return running


def gather(ray: Any, jobs: list[RunningJob], rows: list[FleetRow | None]) -> None:
    """Wait for every job's row, stopping those past their limits; fills ``rows``."""
    active = list(jobs)
    try:
        while active:
            now = time.monotonic()
            lefts = [left for r in active if (left := r.left_s(now)) is not None]
            timeout = max(0.0, min(lefts)) if lefts else None
            refs = [ref for r in active for ref in r.waiting]
            done, _ = ray.wait(refs, num_returns=1, timeout=timeout)
            for ref in done:
                running = next(r for r in active if ref in r.waiting)
                running.waiting.discard(ref)
                if ref == running.started_ref:
                    running.started = time.monotonic()
                    running.node = _get(ray, ref, "")
                else:
                    rows[running.index] = _row(ray, running)
                    _stop(ray, running)
                    active.remove(running)
            now = time.monotonic()
            for running in [r for r in active if r.overdue(now)]:
                rows[running.index] = _timed_out(running, now)
                _stop(ray, running)
                active.remove(running)
    finally:
        for running in active:  # interrupted: no worker outlives the call
            _stop(ray, running)


def _get(ray: Any, ref: Any, default: Any) -> Any:
    try:
        return ray.get(ref)
    except Exception:  # the worker could not start: the row's call says why
        return default


def _row(ray: Any, running: RunningJob) -> FleetRow:
    try:
        row = ray.get(running.row_ref)
    except Exception as exc:  # the worker died, or Ray could not run it
        return FleetRow(running.job.name, status="failed", node=running.node, error=_text(exc))
    if not isinstance(row, FleetRow):
        return FleetRow(running.job.name, status="failed", error=f"the worker returned {row!r}")
    return row


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _timed_out(running: RunningJob, now: float) -> FleetRow:
    assert running.started is not None and running.limit_s is not None
    log.warning(
        "fleet job %s ran past its time limit (%g s): its worker is stopped",
        running.job.name,
        running.limit_s,
    )
    return FleetRow(
        running.job.name,
        status="timed out",
        node=running.node,
        wall_s=now - running.started,
        error=(
            f"ran past its time limit of {running.limit_s:g} s (Job(time_limit=...)); "
            "its worker was stopped"
        ),
    )


def _stop(ray: Any, running: RunningJob) -> None:
    """Kill the job's actor (its process ends); never raises."""
    try:
        ray.kill(running.actor, no_restart=True)
    except Exception as exc:  # already gone
        log.debug("fleet job %s: worker not killed: %s", running.job.name, exc)
