"""``tunetree.fleet.tune``: run jobs as Ray tasks, gather one row per job and node.

Ray is imported only here, when a fleet tune runs (``pip install 'tunetree[fleet]'``).
``address=None`` joins the Ray this process already runs, else starts a local one (bound to
the loopback, its workers importing this process's code), which is shut down afterwards;
``"auto"`` or ``"ray://host:10001"`` joins that cluster. Jobs whose resources no node offers
fail at once with that reason, instead of waiting forever.
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
from .report import FleetReport, FleetRow
from .worker import run_job

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

    Imports Ray only when called (``pip install 'tunetree[fleet]'``).

    Args:
        jobs: The jobs.
        remote: ``s3://BUCKET/PREFIX`` (default ``$TUNETREE_CACHE_REMOTE`` here); the nodes need
            the S3 endpoint and credentials (and ``$TUNETREE_CACHE_KEY`` when entries are
            signed) in their own environment.
        address: A Ray cluster's address (``"auto"``); None starts or joins a local Ray.
        cache_dir: Each node's local cache (default its ``$TUNETREE_CACHE_DIR`` or
            ``~/.cache/tunetree``).
        runtime_env: Ray's runtime environment for the tasks.

    Returns:
        A :class:`FleetReport`: one row per job, in order; a job that fails is a row with its
        error.

    Raises:
        InvalidInputError: An object that is not a :class:`Job`, or two jobs with one name.
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
    offered = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    task = ray.remote(run_job)
    pending: dict[int, Any] = {}
    rows: list[FleetRow | None] = [None] * len(jobs)
    for i, job in enumerate(jobs):
        missing = _unplaceable(job, offered)
        if missing is not None:
            rows[i] = FleetRow(job.name, status="failed", error=missing)
            continue
        pending[i] = task.options(**job.ray_options()).remote(job, remote, cache_dir)
    for i, ref in pending.items():
        try:
            rows[i] = ray.get(ref)
        except Exception as exc:  # the worker died, or Ray could not run the task
            rows[i] = FleetRow(jobs[i].name, status="failed", error=f"{type(exc).__name__}: {exc}")
    return FleetReport([r for r in rows if r is not None])


def _unplaceable(job: Job, offered: list[dict[str, float]]) -> str | None:
    """Why no alive node can run the job (None when one can)."""
    wanted = {"CPU": 1.0, **job.resources}
    for node in offered:
        if all(node.get(name, 0.0) >= amount for name, amount in wanted.items()):
            return None
    return f"no node of the cluster offers {wanted}"
