"""A remote that is down, hangs, or dies during an upload never breaks tuning.

The hanging remote is a real socket that accepts and never answers; the killed one is a real
SeaweedFS server killed (SIGKILL) after the first artifact of an entry was uploaded.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

import tunetree as tt
from tunetree.cache.remote import RemoteTier
from tunetree.cache.s3 import Timeouts

from ..servers import BUCKET, FLEET_KEY, HangingServer, SeaweedS3, free_ports
from . import fakes
from .remote_helpers import DATA, objects, tune_tree

FAST = Timeouts(connect_s=1.0, read_s=1.0, transfer_s=5.0, attempts=2)
PATIENT = Timeouts(connect_s=1.0, read_s=15.0, transfer_s=30.0, attempts=2)
"""For a live server on a busy machine: a killed one refuses connections at once anyway."""


def _remote_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("tunetree.cache")
    ]


@pytest.mark.parametrize("kind", ["hangs", "is down"])
def test_auto_tune_completes_with_one_warning_when_the_remote(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    hanging = HangingServer() if kind == "hangs" else None
    endpoint = hanging.endpoint if hanging else f"http://127.0.0.1:{free_ports(1)[0]}"
    try:
        tier = RemoteTier(f"s3://{BUCKET}/x", secret=b"k", endpoint_url=endpoint, timeouts=FAST)
        cache = tt.TuningCache(tmp_path / "local", remote=tier)
        model = fakes.tree()
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="tunetree"):
            result = tt.auto_tune(
                model,
                DATA,
                strategy=fakes.strategy("first-wins"),
                measure_config=tt.MeasureConfig.quick(),
                time_budget=60,
                verbose=False,
                cache=cache,
            )
        elapsed = time.monotonic() - start
    finally:
        if hanging:
            hanging.close()
    assert result.rows and cache.stats.stored >= 3  # the local cache went on
    assert elapsed < 60
    warnings = _remote_warnings(caplog)
    assert len(warnings) == 1 and "cannot be used" in warnings[0], warnings
    assert tier.breaker.failures == 1  # asked once, then skipped for the cool-down


@pytest.fixture
def private_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    server = SeaweedS3(tmp_path / "seaweedfs")
    server.start()
    for name, value in {**server.env(), **FLEET_KEY}.items():
        monkeypatch.setenv(name, value)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow  # starts a server of its own, twice
def test_a_server_killed_during_an_upload_leaves_no_entry(
    tmp_path: Path, private_server: SeaweedS3, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"s3://{BUCKET}/killed"
    tier = RemoteTier(url, timeouts=PATIENT)
    uploaded: list[str] = []

    def kill_after_first(sha: str) -> None:
        uploaded.append(sha)
        private_server.stop()

    tier.after_artifact = kill_after_first
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        first = tune_tree(tt.TuningCache(tmp_path / "a", remote=tier), depths=(0, 1))
    assert first["ok"] and len(first["builds"]) == 3  # tuning went on, locally
    assert len(uploaded) == 1 and len(_remote_warnings(caplog)) == 1
    private_server.start()  # same data, same ports: what the crash left behind
    assert objects(private_server, url, "entries") == {}  # no manifest: no entry at all
    # The artifact uploaded before the crash may be listed without its data: a writer writes
    # every artifact again, so the entry it publishes is whole.
    later = tune_tree(tt.TuningCache(tmp_path / "b", remote=url), depths=(0, 1))
    assert later["ok"] and len(later["builds"]) == 3 and later["remote_stored"] == 3
    again = tune_tree(tt.TuningCache(tmp_path / "c", remote=url), depths=(0, 1))
    assert again["builds"] == [] and again["remote_hits"] == 3


def test_a_remote_that_refuses_costs_one_warning(
    tmp_path: Path, remote: str, caplog: pytest.LogCaptureFixture
) -> None:
    refusing = remote.replace(BUCKET, "no-such-bucket-here")  # the server answers, and refuses
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        report = tune_tree(tt.TuningCache(tmp_path / "a", remote=refusing), depths=(0, 1))
    assert report["ok"] and len(report["builds"]) == 3 and report["remote_stored"] == 0
    warnings = _remote_warnings(caplog)
    assert len(warnings) == 1 and "NoSuchBucket" in warnings[0], warnings
