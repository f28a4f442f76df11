"""Hostile and broken remotes against a real S3 server: flipped bytes, swapped entries, keys.

Each case checks that no wrong number is served, that the graph is tuned again where the remote
entry cannot be used, and that the writer then heals the remote so a later host builds nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from tunetree.cache.sealing import KEY_ENV, TRUST_UNSIGNED_ENV

from .remote_helpers import new_cache, objects, put, tune_tree


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def _heals(tmp_path: Path, remote: str, name: str) -> None:
    """A later host gets every graph from the remote without a build."""
    later = tune_tree(new_cache(tmp_path, name, remote))
    assert later["builds"] == [] and later["remote_hits"] == 5 and later["ok"]


def test_flipped_artifact_bytes_are_refused_and_replaced(
    tmp_path: Path, remote: str, s3_server, caplog: pytest.LogCaptureFixture
) -> None:
    tune_tree(new_cache(tmp_path, "a", remote), depths=(0, 1, 2))
    artifacts = objects(s3_server, remote, "artifacts")
    weights = max(artifacts, key=lambda n: len(artifacts[n]))  # a safetensors file
    put(
        s3_server,
        remote,
        "artifacts",
        weights,
        _flip(artifacts[weights], len(artifacts[weights]) - 3),
    )
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        second = tune_tree(new_cache(tmp_path, "b", remote))
    assert second["ok"]  # never wrong numbers
    assert second["builds"], "the graphs whose artifact was corrupted are tuned again"
    assert any("corrupted" in r.getMessage() for r in caplog.records)
    assert hashlib.sha256(objects(s3_server, remote, "artifacts")[weights]).hexdigest() == weights
    _heals(tmp_path, remote, "c")


@pytest.mark.slow
def test_flipped_manifest_bytes_are_refused_and_replaced(
    tmp_path: Path, remote: str, s3_server
) -> None:
    tune_tree(new_cache(tmp_path, "a", remote), depths=(0,))
    ((key, envelope),) = objects(s3_server, remote, "entries").items()
    at = envelope.index(b'"winner"')
    put(s3_server, remote, "entries", key, _flip(envelope, at + 2))
    second = tune_tree(new_cache(tmp_path, "b", remote), depths=(0,))
    assert second["ok"] and len(second["builds"]) == 1 and second["remote_hits"] == 0
    assert second["remote_stored"] == 1  # replaced the corrupted envelope
    third = tune_tree(new_cache(tmp_path, "c", remote), depths=(0,))
    assert third["builds"] == [] and third["remote_hits"] == 1


def _entries_by_path(server, remote: str) -> dict[str, tuple[str, bytes]]:
    found = {}
    for key, envelope in objects(server, remote, "entries").items():
        body = json.loads(envelope.split(b"\n", 4)[4])
        found[body["path"]] = (key, envelope)
    return found


def test_an_entry_of_another_graph_copied_under_this_key_is_never_served(
    tmp_path: Path, remote: str, s3_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the key, and trusting unsigned entries: what is left is the check against eager.
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.setenv(TRUST_UNSIGNED_ENV, "1")
    tune_tree(new_cache(tmp_path, "a", remote), depths=(1,))  # a and b: same structure
    entries = _entries_by_path(s3_server, remote)
    (_, envelope_a), (key_b, _) = entries["a"], entries["b"]
    put(s3_server, remote, "entries", key_b, envelope_a)  # copied as it is
    second = tune_tree(new_cache(tmp_path, "b", remote), depths=(1,))
    assert second["ok"] and second["builds"] == ["test-saving:b"] and second["remote_hits"] == 1
    # A forger rewrites the key everywhere and fixes the manifest's checksum: the entry of `a`
    # (its weights baked in) now looks like b's, and only the check against eager can tell.
    head, manifest = envelope_a.split(b"\n", 3)[:3], envelope_a.split(b"\n", 3)[3]
    body = json.loads(manifest.split(b"\n", 1)[1])
    body["key"], body["path"] = key_b, "b"
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    forged = (
        b"\n".join(
            [head[0], b"key " + key_b.encode(), head[2], hashlib.sha256(data).hexdigest().encode()]
        )
        + b"\n"
        + data
    )
    put(s3_server, remote, "entries", key_b, forged)
    third = tune_tree(new_cache(tmp_path, "c", remote), depths=(1,))
    assert third["ok"], "the forged runner's outputs differ from eager: it must not serve"
    assert third["builds"] == ["test-saving:b"]


def test_with_the_key_set_an_entry_written_without_it_is_refused(
    tmp_path: Path, remote: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    unsigned = tune_tree(new_cache(tmp_path, "writer-without-key", remote), depths=(0,))
    assert unsigned["remote_stored"] == 1
    monkeypatch.setenv(KEY_ENV, "fleet secret")
    keyed = tune_tree(new_cache(tmp_path, "a", remote), depths=(0,))
    assert keyed["builds"] == ["test-saving:"] and keyed["remote_hits"] == 0
    assert keyed["remote_stored"] == 1  # the unsigned entry was replaced by a signed one
    later = tune_tree(new_cache(tmp_path, "b", remote), depths=(0,))
    assert later["builds"] == [] and later["remote_hits"] == 1
    monkeypatch.setenv(KEY_ENV, "another secret")
    other = tune_tree(new_cache(tmp_path, "c", remote), depths=(0,))
    assert other["remote_hits"] == 0 and other["builds"] == ["test-saving:"]
