"""The remote tier against a real S3 server (SeaweedFS): read-through, write-through, faults."""

from __future__ import annotations

from pathlib import Path

from .remote_helpers import new_cache, objects, tune_tree


def test_a_fresh_host_gets_every_graph_from_the_remote_with_no_build(
    tmp_path: Path, remote: str, s3_server
) -> None:
    first = tune_tree(new_cache(tmp_path, "host-a", remote))
    assert first["ok"] and len(first["builds"]) == 5 and first["remote_stored"] == 5
    assert len(objects(s3_server, remote, "entries")) == 5
    second = tune_tree(new_cache(tmp_path, "host-b", remote))
    assert second == {"builds": [], "hits": 5, "remote_hits": 5, "remote_stored": 0, "ok": True}
