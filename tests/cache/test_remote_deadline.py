"""A server that drips its answer cannot stall a lookup past the transfer deadline.

The server answers ``Content-Length: 4000`` and then one byte every 2 s: each read gets a
byte well within the read timeout, so only a deadline held inside every read bounds it.
Before, ``RemoteTier.pull`` with ``transfer_s=10`` was still running after 90 s (the deadline
was checked only between 1 MiB reads, each of which waited for its whole megabyte).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tunetree.cache.remote import RemoteTier
from tunetree.cache.s3 import RemoteUnavailable, Timeouts
from tunetree.cache.store import CacheStore

from ..servers import BUCKET, CREDENTIALS, DrippingServer

DEADLINE = Timeouts(transfer_s=10.0)
MARGIN_S = 4.0
"""What a busy machine may add to the deadline (the read timeout, 5 s, must not be added)."""


@pytest.fixture
def dripping(monkeypatch: pytest.MonkeyPatch) -> Iterator[DrippingServer]:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    server = DrippingServer(length=4000, interval_s=2.0)
    try:
        yield server
    finally:
        server.close()


def _timed(call: Callable[[], Any], wait_s: float) -> tuple[Any, float]:
    """``call()``'s result (or exception) and its duration; fails when it outlives ``wait_s``."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        start = time.monotonic()
        try:
            outcome["result"] = call()
        except Exception as exc:
            outcome["result"] = exc
        outcome["elapsed"] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait_s)
    assert not thread.is_alive(), f"still running after {wait_s:.0f} s"
    return outcome["result"], outcome["elapsed"]


def _tier(server: DrippingServer) -> RemoteTier:
    return RemoteTier(
        f"s3://{BUCKET}/x", secret=b"fleet key", endpoint_url=server.endpoint, timeouts=DEADLINE
    )


def test_a_dripping_server_cannot_stall_a_lookup(dripping: DrippingServer, tmp_path: Path) -> None:
    tier = _tier(dripping)
    store = CacheStore(tmp_path / "local")
    pulled, elapsed = _timed(lambda: tier.pull("a" * 40, store, lambda m: None), 40.0)
    assert pulled is False and dripping.requests >= 1
    assert elapsed < DEADLINE.transfer_s + MARGIN_S, elapsed
    assert tier.breaker.failures == 1 and not tier.breaker.available()  # an outage: skipped


def test_a_dripping_artifact_download_is_cut_off_at_the_deadline(
    dripping: DrippingServer, tmp_path: Path
) -> None:
    tier = _tier(dripping)
    target = tmp_path / "artifact"
    error, elapsed = _timed(lambda: tier.client.download("v1/artifacts/x", target, 4000), 40.0)
    assert isinstance(error, RemoteUnavailable), error
    assert "cut off" in str(error) or "timed out" in str(error).lower(), error
    assert elapsed < DEADLINE.transfer_s + MARGIN_S, elapsed


@pytest.fixture
def dripping_headers(monkeypatch: pytest.MonkeyPatch) -> Iterator[DrippingServer]:
    """Its answer's headers come one byte every 2 s (about 130 bytes: over 4 minutes)."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    server = DrippingServer(length=4000, interval_s=2.0, headers=True)
    try:
        yield server
    finally:
        server.close()


def test_dripped_headers_cannot_stall_a_lookup(
    dripping_headers: DrippingServer, tmp_path: Path
) -> None:
    """The read timeout bounds each read only: the request's deadline holds across them."""
    tier = _tier(dripping_headers)
    store = CacheStore(tmp_path / "local")
    pulled, elapsed = _timed(lambda: tier.pull("a" * 40, store, lambda m: None), 40.0)
    assert pulled is False and dripping_headers.requests >= 1
    assert elapsed < DEADLINE.transfer_s + MARGIN_S, elapsed
    assert tier.breaker.failures == 1 and not tier.breaker.available()  # an outage: skipped
    assert not [t for t in threading.enumerate() if t.name == "tunetree-interrupt"]


@pytest.mark.parametrize("operation", ["head", "delete", "list"])
def test_a_request_that_moves_no_object_is_cut_off_at_its_deadline(
    dripping_headers: DrippingServer, operation: str
) -> None:
    timeouts = Timeouts(request_s=6.0)
    tier = RemoteTier(
        f"s3://{BUCKET}/x", secret=b"k", endpoint_url=dripping_headers.endpoint, timeouts=timeouts
    )
    calls = {
        "head": lambda: tier.client.head("v1/entries/x"),
        "delete": lambda: tier.client.delete("v1/entries/x"),
        "list": lambda: list(tier.client.list("v1/entries")),
    }
    error, elapsed = _timed(calls[operation], 40.0)
    assert isinstance(error, RemoteUnavailable), error
    assert "cut off" in str(error), error
    assert elapsed < timeouts.request_s + MARGIN_S, elapsed
