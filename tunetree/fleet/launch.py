"""``tunetree.fleet.tune``: run jobs on Ray, gather one row per job and node.

Ray is imported only here, when a fleet tune runs (``pip install 'tunetree[fleet]'``).
``address=None`` joins the Ray this process already runs, else starts a local one (bound to
the loopback, its workers importing this process's code), which is shut down afterwards;
``"auto"`` or ``"ray://host:10001"`` joins that cluster. Jobs are placed by
:mod:`~tunetree.fleet.placement` (by default a whole node each) and run and held to their time
limits by :mod:`~tunetree.fleet.running`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from typing import Any

from ..cache.remote import ENV_REMOTE
from ..cache.s3 import S3Location
from ..errors import InvalidInputError, MissingDependencyError
from .job import Job
from .placement import place
from .report import FleetReport, FleetRow
from .running import gather, submit
from .worker import JobWorker

log = logging.getLogger(__name__)


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MissingDependencyError(
            "tunetree.fleet needs Ray: pip install 'tunetree[fleet]'"
        ) from exc
    return ray


def tune(
    jobs: Iterable[Job],
    *,
    remote: str | None = None,
    address: str | None = None,
    cache_dir: str | None = None,
    runtime_env: dict[str, Any] | None = None,
) -> FleetReport:
    """Tune every job on a node that offers its resources, into the shared cache ``remote``.

    Imports Ray only when called (``pip install 'tunetree[fleet]'``). Each job tunes with the
    threads hosts of its kind serve with (:class:`Job`); its row says how many.

    Args:
        jobs: The jobs.
        remote: ``s3://BUCKET/PREFIX`` (default ``$TUNETREE_CACHE_REMOTE`` here); the nodes need
            the S3 endpoint and credentials and ``$TUNETREE_CACHE_KEY`` (a remote is read only
            for entries signed with it) in their own environment.
        address: A Ray cluster's address (``"auto"``); None starts or joins a local Ray.
        cache_dir: Each node's local cache (default its ``$TUNETREE_CACHE_DIR`` or
            ``~/.cache/tunetree``).
        runtime_env: Ray's runtime environment for the tasks.

    Returns:
        A :class:`FleetReport`: one row per job, in order; a job that fails, or runs past its
        time limit (:meth:`Job.limit_s`; its worker is then stopped), is a row with the reason.

    Raises:
        InvalidInputError: An object that is not a :class:`Job`, two jobs with one name, or a
            malformed remote.
        MissingDependencyError: Ray is not installed.

    Example:
        >>> import tunetree as tt
        >>> jobs = [tt.fleet.Job("mlp", build="models:mlp", data="models:mlp_data")]
        >>> # report = tt.fleet.tune(jobs, remote="s3://bucket/tunetree")  # needs Ray and S3
    """
    jobs = list(jobs)
    if not all(isinstance(j, Job) for j in jobs):
        raise InvalidInputError("tunetree.fleet.tune takes tunetree.fleet.Job objects")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"job names must differ: {names}")
    remote = remote or os.environ.get(ENV_REMOTE) or None
    if remote is not None:
        S3Location.parse(remote)  # a bad URL fails here, not on every worker
    ray = _ray()
    started = _connect(ray, address, runtime_env)
    try:
        return _run(ray, jobs, remote, cache_dir)
    finally:
        if started:
            ray.shutdown()


def _connect(ray: Any, address: str | None, runtime_env: dict[str, Any] | None) -> bool:
    """Join or start Ray; True when this call started it (and must shut it down)."""
    if ray.is_initialized():
        return False
    if address is not None:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        return True
    path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    ray.init(
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        runtime_env=runtime_env or {"env_vars": {"PYTHONPATH": path}},
        log_to_driver=False,
    )
    return True


def _run(ray: Any, jobs: list[Job], remote: str | None, cache_dir: str | None) -> FleetReport:
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    worker = ray.remote(JobWorker)
    rows: list[FleetRow | None] = [None] * len(jobs)
    submitted = []
    for i, job in enumerate(jobs):
        placement = place(job, nodes)
        if placement.problem is not None:
            rows[i] = FleetRow(job.name, status="failed", error=placement.problem)
            continue
        submitted.append(submit(ray, worker, i, job, placement.cpus, remote, cache_dir))
    gather(ray, submitted, rows)
    return FleetReport([r for r in rows if r is not None])
