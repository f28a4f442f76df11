"""Shared test setup: no test writes to the user's real cache directory; a virtual clock."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.clock import VirtualClock


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNETREE_CACHE_DIR", str(tmp_path_factory.mktemp("tunetree-cache")))


@pytest.fixture
def virtual_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[VirtualClock]:
    """Measured durations are the fakes' declared ones (``tests/clock.py``), whatever the load."""
    clock = VirtualClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    yield clock
