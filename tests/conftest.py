"""Shared test setup: no test writes to the user's real cache directory."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNETREE_CACHE_DIR", str(tmp_path_factory.mktemp("tunetree-cache")))
