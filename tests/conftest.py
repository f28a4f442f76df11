"""Shared test setup: no test writes to the user's real cache directory; a virtual clock.

Real servers, started once per session and only when a test asks for them: ``s3_server``
(SeaweedFS's S3 gateway on 127.0.0.1, tests/servers.py) and ``ray_local`` (a local Ray with 2
CPUs). ``remote`` points boto3 at the S3 server and gives each test its own prefix.
``virtual_time`` makes measured durations the fakes' declared ones (tests/clock.py).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .clock import VirtualClock
from .servers import BUCKET, FLEET_KEY, SeaweedS3

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNETREE_CACHE_DIR", str(tmp_path_factory.mktemp("tunetree-cache")))
    for name in ("TUNETREE_CACHE_REMOTE", "TUNETREE_CACHE_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def virtual_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[VirtualClock]:
    """Measured durations are the fakes' declared ones (``tests/clock.py``), whatever the load."""
    clock = VirtualClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    yield clock


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A real S3 server (SeaweedFS) for the whole session, killed at its end."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def remote(s3_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://BUCKET/<fresh prefix>`` on the session's server; boto3's variables point at it.

    The fleet's key (:data:`FLEET_KEY`) is set too; a test of a host without it unsets it.
    """
    for name, value in {**s3_server.env(), **FLEET_KEY}.items():
        monkeypatch.setenv(name, value)
    return f"s3://{BUCKET}/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def ray_local(s3_server: SeaweedS3) -> Iterator[object]:
    """A local Ray (2 CPUs, loopback only) whose workers import this checkout's code.

    Its workers reach the session's S3 server (boto3's variables and the fleet's key are set
    for them).
    """
    import ray

    path = os.pathsep.join([str(ROOT), *(p for p in sys.path if p and os.path.isdir(p))])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"PYTHONPATH": path, **s3_server.env(), **FLEET_KEY}},
        log_to_driver=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
