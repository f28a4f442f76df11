"""The remote tier against a real S3 server (SeaweedFS): read-through, write-through, faults."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

import tunetree as tt
from tunetree.cache import open_cache
from tunetree.cache.remote import ENV_REMOTE

from .remote_helpers import new_cache, objects, tune_tree


def test_a_fresh_host_gets_every_graph_from_the_remote_with_no_build(
    tmp_path: Path, remote: str, s3_server
) -> None:
    first = tune_tree(new_cache(tmp_path, "host-a", remote))
    assert first["ok"] and len(first["builds"]) == 5 and first["remote_stored"] == 5
    assert len(objects(s3_server, remote, "entries")) == 5
    second = tune_tree(new_cache(tmp_path, "host-b", remote))
    assert second == {"builds": [], "hits": 5, "remote_hits": 5, "remote_stored": 0, "ok": True}


def test_the_environment_variable_turns_the_remote_on(
    tmp_path: Path, remote: str, monkeypatch: pytest.MonkeyPatch, s3_server
) -> None:
    monkeypatch.setenv(ENV_REMOTE, remote)
    cache = open_cache(None)
    assert isinstance(cache, tt.TuningCache) and cache.remote is not None
    assert cache.remote.url == remote
    assert cache.directory == Path(os.environ["TUNETREE_CACHE_DIR"])
    assert tune_tree(cache, depths=(0,))["remote_stored"] == 1
    assert len(objects(s3_server, remote, "entries")) == 1


def test_a_bad_remote_url_fails_when_given_and_is_skipped_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(tt.CacheError, match="bucket"):
        tt.TuningCache(remote="s3://A_B/x")
    with pytest.raises(tt.CacheError, match="s3://BUCKET/PREFIX"):
        tt.TuningCache(remote="https://example.invalid/x")
    monkeypatch.setenv(ENV_REMOTE, "s3://A_B/x")
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        cache = open_cache(None)
    assert cache is not None and cache.remote is None  # type: ignore[attr-defined]
    assert any(ENV_REMOTE in r.getMessage() for r in caplog.records)


def test_without_boto3_the_remote_asks_for_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if it were not installed
    with pytest.raises(tt.MissingDependencyError, match=r"tunetree\[remote\]"):
        tt.TuningCache(remote="s3://bucket/prefix")
