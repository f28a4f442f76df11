"""A hostile tuning cache (issue 13): a cache directory on shared storage is as hostile as a
downloaded file. Built from the committed first-release cache, edited, checksums recomputed:
no symbolic link is followed, no special file opened, every command reports damage."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoint.fixtures.make_fixtures import HERE
from tunetree.cache.store import CacheStore
from tunetree.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    directory = tmp_path / "cache"
    shutil.copytree(HERE / "v1_cache", directory)
    return directory


def _key(cache: Path) -> str:
    return next(p.name for p in (cache / "entries").iterdir())


def _edit_manifest(cache: Path, edit: Any) -> None:
    """Change an entry's manifest and recompute its checksum line, as an attacker would."""
    path = cache / "entries" / _key(cache) / "manifest.json"
    body = json.loads(path.read_bytes().partition(b"\n")[2])
    edit(body)
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)


def _cli(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``tunetree cache ...`` in a child process (a hang shows as a timeout)."""
    code = "import sys; from tunetree.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "cache", "--dir", str(cache), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(REPO)]),
        },
    )


def test_gc_never_follows_a_linked_artifact_shard(cache: Path, tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    victim = outside / ("ab" * 32)
    victim.write_text("keep me")
    os.utime(victim, (1, 1))
    (cache / "artifacts" / "ab").symlink_to(outside)
    assert cli_main(["cache", "--dir", str(cache), "gc"]) == 0
    assert victim.read_text() == "keep me"


def test_a_linked_hits_file_is_never_written_through(cache: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    key = _key(cache)
    (cache / "hits" / key).unlink(missing_ok=True)
    (cache / "hits" / key).symlink_to(outside)
    store = CacheStore(cache)
    store.markers.record_hit(key)
    store.markers.touch_hits(key)
    assert outside.read_text() == "x"
    (cache / "hits" / key).unlink()
    absent = tmp_path / "created-outside.txt"
    (cache / "hits" / key).symlink_to(absent)
    store.markers.record_hit(key)
    assert not absent.exists()


@pytest.mark.parametrize("special", ["fifo", "dev-zero"])
@pytest.mark.parametrize("command", ["ls", "verify", "gc"])
def test_special_manifests_are_reported_not_opened(special: str, command: str, cache: Path) -> None:
    path = cache / "entries" / _key(cache) / "manifest.json"
    path.unlink()
    if special == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    done = _cli(cache, command)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b.update(candidates="x"),
        lambda b: b.update(winner=[0]),
        lambda b: b["candidates"][0]["artifact"]["files"][0].update(path="../../outside"),
        lambda b: b["candidates"][0]["artifact"]["files"][0].update(sha256=["x"]),
        lambda b: b.update(graph={"args": [[[[[]]]]] * 3}),
    ],
)
@pytest.mark.parametrize("command", ["ls", "verify", "gc"])
def test_wrong_types_with_a_valid_checksum_are_reported(
    edit: Any, command: str, cache: Path
) -> None:
    _edit_manifest(cache, edit)
    done = _cli(cache, command)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    if command == "verify":
        assert done.returncode == 1 and "CORRUPT" in done.stdout


def test_gc_on_a_cache_it_cannot_change_reports(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A read-only cache (simulated: the tests may run as root, which ignores modes)."""
    _edit_manifest(cache, lambda b: b.update(candidates="x"))  # gives gc something to remove

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(os, "rename", refuse)
    assert cli_main(["cache", "--dir", str(cache), "gc"]) == 2
    assert "cannot change" in capsys.readouterr().err


def test_linked_family_records_are_never_followed(cache: Path, tmp_path: Path) -> None:
    """A ``families/`` record that is a link, or a family that is a link to a directory
    elsewhere: lookups list nothing through it and gc removes the link, not its target."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / ("a" * 40)).write_text("keep")
    store = CacheStore(cache)
    (store.families / ("b" * 40)).symlink_to(outside)
    assert store.markers.family_members("b" * 40) == []
    assert store.markers.family_members("../outside") == []  # not a family name
    real = store.families / ("c" * 40)
    real.mkdir()
    (real / ("d" * 40)).symlink_to(outside / ("a" * 40))
    assert cli_main(["cache", "--dir", str(cache), "gc"]) == 0
    assert (outside / ("a" * 40)).read_text() == "keep"
    assert not (store.families / ("b" * 40)).exists()
    assert not (real / ("d" * 40)).is_symlink()  # a record of no entry: pruned


@pytest.mark.timeout(120)
def test_gc_removes_family_records_that_are_not_regular_records(cache: Path) -> None:
    """Issue 19: a folder and a FIFO placed as family records, named like the cache's own
    entry (so "the entry is gone" does not catch them): gc removes both, never opening the
    FIFO (opening it for reading would block), and says how many it removed."""
    key = _key(cache)
    store = CacheStore(cache)
    family = store.families / ("e" * 40)
    family.mkdir(parents=True, exist_ok=True)
    (family / key).mkdir()
    (family / key / "inside").write_text("x")
    other = store.families / ("f" * 40)
    other.mkdir()
    os.mkfifo(other / key)
    done = _cli(cache, "gc", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["family_records"] == 2
    assert not (family / key).exists() and not (other / key).exists()
    assert store.markers.family_members("e" * 40) == []
