"""A local cache that cannot take the remote's entries costs a warning, never the tuning.

Before, with the local cache's ``tmp/`` refusing writes, ``tt.tune`` with a remote raised
``PermissionError`` out of ``RemoteTier._materialize`` (the staging directory of a pulled
entry could not be made).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import tunetree as tt

from .remote_helpers import tune_tree
from .unwritable import unwritable


def test_a_local_cache_whose_tmp_refuses_writes_warns_and_tuning_goes_on(
    tmp_path: Path, remote: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = tune_tree(tt.TuningCache(tmp_path / "a", remote=remote), depths=(0, 1))
    assert first["remote_stored"] == 3
    cache = tt.TuningCache(tmp_path / "b", remote=remote)
    with caplog.at_level(logging.WARNING, logger="tunetree"), unwritable(cache.disk.tmp):
        second = tune_tree(cache, depths=(0, 1))
    assert second["ok"] and second["remote_hits"] == 0  # tuned here, results preserved
    assert len(second["builds"]) == 3
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("tunetree.cache")
    ]
    # One for the remote's entries it cannot take, one for its own it cannot store.
    assert len(warnings) == 2, warnings
    assert "cannot take entries from the remote" in warnings[0]
    assert str(cache.disk.root) in warnings[0] and "could not store" in warnings[1]


def test_local_entries_are_not_marked_invalid_while_tmp_refuses_writes(tmp_path: Path) -> None:
    """A hit stages its artifacts under tmp/: when it cannot, the entry is not at fault."""
    cache_dir = tmp_path / "local"
    tune_tree(tt.TuningCache(cache_dir, remote=False), depths=(0, 1))
    cache = tt.TuningCache(cache_dir, remote=False)
    with unwritable(cache.disk.tmp):
        during = tune_tree(cache, depths=(0, 1))
    assert during["ok"] and during["hits"] == 0  # tuned again, results preserved
    assert list(cache.disk.invalid.iterdir()) == [], "sound entries were marked invalid"
    after = tune_tree(tt.TuningCache(cache_dir, remote=False), depths=(0, 1))
    assert after["builds"] == [] and after["hits"] == 3 and after["ok"]
