"""What runs on a worker: build the job's model and data there, auto-tune into the shared cache.

Every failure becomes the job's row (its error), so one job that fails never loses the others.
:class:`JobWorker` is what ``tune`` makes a Ray actor of, one per job, so that a job past its
time limit can be stopped with its process.
"""

from __future__ import annotations

import logging
import socket
import time
import traceback
from typing import Any

import torch

from ..cache import TuningCache
from ..candidates.budget import BUILD
from ..search.auto import auto_tune
from ..search.untuned import why_untuned
from .hardware import hardware_class
from .job import Job, resolve
from .report import FleetRow
from .threads import default_threads, tuning_threads

log = logging.getLogger(__name__)


def _device(model: Any) -> torch.device:
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        for p in parameters():
            return p.device  # type: ignore[no-any-return]
    return torch.device("cpu")


def run_job(job: Job, remote: str | None, cache_dir: str | None) -> FleetRow:
    """Tune ``job`` on this node into the local cache and the ``remote`` tier; its row.

    Tuned with :attr:`Job.threads` torch threads (None: this node's default), restored after.
    """
    start = time.perf_counter()
    row = FleetRow(job.name, node=socket.gethostname())
    try:
        with tuning_threads(job.threads) as row.threads:
            _tune(job, remote, cache_dir, row)
    except Exception as exc:
        row.status, row.error = "failed", f"{type(exc).__name__}: {exc}"
        log.info("fleet job %s failed:\n%s", job.name, traceback.format_exc())
    row.wall_s = time.perf_counter() - start
    return row


def _tune(job: Job, remote: str | None, cache_dir: str | None, row: FleetRow) -> None:
    """Build, load the data and auto-tune; fills ``row`` (raises on failure)."""
    row.hardware = hardware_class("cpu")
    model = resolve(str(job.build))()
    data = resolve(str(job.data))()
    row.hardware = hardware_class(_device(model))
    cache = TuningCache(cache_dir, remote=remote if remote else None)
    options = {"verbose": False, **job.auto_tune}
    result = auto_tune(model, data, cache=cache, **options)
    row.depth, row.speedup, row.tuning_s = result.depth, result.speedup, result.tuning_s
    row.untuned = why_untuned(result)
    if row.untuned:
        log.info("fleet job %s left untuned: %s\n%s", job.name, row.untuned, result)
    if result.breakdown is not None:
        row.builds = sum(p.count for p in result.breakdown.phases if p.phase == BUILD)
    row.cache_hits = cache.stats.hits
    row.remote_hits = cache.stats.remote_hits
    row.remote_stored = cache.stats.remote_stored
    cache.close()


class JobWorker:
    """One job's process on a node (a Ray actor): ready, then the job."""

    def ready(self, job: Job) -> str:
        """This node's host name, once the worker is set up for ``job``.

        Its default thread count is measured here when the job uses it, so the job's time
        limit, which starts when this answers, counts the job alone.
        """
        if job.threads is None:
            default_threads()
        return socket.gethostname()

    def run(self, job: Job, remote: str | None, cache_dir: str | None) -> FleetRow:
        """:func:`run_job` here."""
        return run_job(job, remote, cache_dir)
