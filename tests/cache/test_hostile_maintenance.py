"""``tunetree cache ls | verify | gc`` against hostile contents: never a traceback, never a
change outside the cache.

* gc removes a read-only junk directory in ``tmp/`` that holds a link to a file outside the
  cache. Before, its removal's error handler chmodded the link, which follows it: the outside
  0400 file became 0700. Run as the cache's owner without root's capabilities (as root, gc
  runs as ``nobody``, since root's removals never fail on modes).
* ``ls`` shows timestamps it cannot print as ``?`` (before: ``OverflowError: timestamp out
  of range`` and a traceback for a ``created`` of 1e300).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoint.fixtures.make_fixtures import HERE
from tunetree.cache.store import CacheStore
from tunetree.cli import main as cli_main

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's own temporary directories are root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="tunetree-hostile-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        for directory, dirs, _ in os.walk(base):
            for name in dirs:
                path = Path(directory, name)
                if not path.is_symlink():
                    path.chmod(0o700)
        shutil.rmtree(base)


def _chown_tree(root: Path, uid: int) -> None:
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.chown(Path(directory, name), uid, uid, follow_symlinks=False)
    os.chown(root, uid, uid)


@contextlib.contextmanager
def _as_owner() -> Iterator[None]:
    """Run the block as the cache's owner without root's capabilities (``nobody`` for root).

    Only the effective ids change (and with them the effective capabilities), so root gets
    them back afterwards; this interpreter lives where ``nobody`` cannot read, so nothing new
    may be imported inside.
    """
    if os.geteuid() != 0:
        yield
        return
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def _gc(cache: Path) -> int:
    return cli_main(["cache", "--dir", str(cache), "gc"])


def test_gc_never_chmods_through_a_link_in_a_read_only_junk_directory(
    shared_dir: Path,
) -> None:
    cache = shared_dir / "cache"
    store = CacheStore(cache)
    outside = shared_dir / "outside.txt"
    outside.write_text("not the cache's")
    outside.chmod(0o400)
    junk = store.tmp / "junk"
    junk.mkdir()
    (junk / "link").symlink_to(outside)
    if os.geteuid() == 0:
        _chown_tree(shared_dir, NOBODY)
    junk.chmod(0o500)
    assert _gc(shared_dir / "warm-up") == 0  # imports what gc needs while still root
    with _as_owner():
        status = _gc(cache)
    assert status == 0
    assert stat.S_IMODE(outside.lstat().st_mode) == 0o400, "gc changed a file outside the cache"
    assert outside.read_text() == "not the cache's"
    assert not junk.exists() or not (junk / "link").is_symlink(), "the junk link is still there"


@pytest.fixture
def fixture_cache(tmp_path: Path) -> Path:
    directory = tmp_path / "cache"
    shutil.copytree(HERE / "v1_cache", directory)
    return directory


def _set_created(cache: Path, created: float) -> None:
    """Write ``created`` into the entry's manifest, checksum recomputed, as an attacker would."""
    (key,) = CacheStore(cache).entry_keys()
    path = cache / "entries" / key / "manifest.json"
    body = json.loads(path.read_bytes().partition(b"\n")[2])
    body["created"] = created
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()  # NaN as NaN
    path.write_bytes(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
    (cache / "hits" / key).unlink(missing_ok=True)  # never used: ls shows when it was made


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("created", [1e300, math.nan, -1e15, math.inf])
def test_ls_shows_a_question_mark_for_a_creation_time_no_date_can_show(
    fixture_cache: Path, created: float, capsys: pytest.CaptureFixture[str]
) -> None:
    _set_created(fixture_cache, created)
    assert cli_main(["cache", "--dir", str(fixture_cache), "ls"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith(tuple("0123456789abcdef"))]
    assert "  ?  " in row and "Traceback" not in out, out
    assert cli_main(["cache", "--dir", str(fixture_cache), "ls", "--json"]) == 0
    listed = _strict_json(capsys.readouterr().out)
    assert isinstance(listed, list) and len(listed) == 1
    assert listed[0]["last_used"] == (created if math.isfinite(created) else None)
    assert cli_main(["cache", "--dir", str(fixture_cache), "verify"]) == 0
    assert cli_main(["cache", "--dir", str(fixture_cache), "gc", "--max-size", "1"]) == 0


def _far_future_dir() -> Iterator[Path]:
    """A directory whose files can hold an mtime of 1e12 s (tmpfs can; ext4 stops at 2446)."""
    for base in (tempfile.gettempdir(), "/dev/shm"):
        if not os.path.isdir(base):
            continue
        directory = Path(tempfile.mkdtemp(dir=base, prefix="tunetree-future-"))
        probe = directory / "probe"
        probe.touch()
        with contextlib.suppress(OSError):
            os.utime(probe, (1e12, 1e12))
        if probe.stat().st_mtime == 1e12:
            yield directory
            shutil.rmtree(directory)
            return
        shutil.rmtree(directory)
    pytest.skip("no file system here keeps an mtime of 1e12 s")


far_future_dir = pytest.fixture(_far_future_dir)


def test_ls_shows_a_question_mark_for_a_hit_counter_touched_far_in_the_future(
    far_future_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = far_future_dir / "cache"
    shutil.copytree(HERE / "v1_cache", cache)
    (key,) = CacheStore(cache).entry_keys()
    hits = cache / "hits" / key
    hits.write_bytes(b"\x01")
    os.utime(hits, (1e12, 1e12))
    assert cli_main(["cache", "--dir", str(cache), "ls"]) == 0
    out = capsys.readouterr().out
    assert " ? " in out and "Traceback" not in out, out
    assert cli_main(["cache", "--dir", str(cache), "gc", "--max-size", "1"]) == 0


def _cli_in_bounded_memory(cache: Path, *args: str, limit_gib: int = 2) -> tuple[int, str]:
    """``tunetree cache ARGS`` in a child process whose address space is limited (a runaway
    allocation shows as MemoryError, not as a machine out of memory)."""
    script = textwrap.dedent(
        f"""
        import resource, sys
        from tunetree.cli import main
        limit = {limit_gib} << 30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        sys.exit(main(["cache", "--dir", {str(cache)!r}, *{list(args)!r}]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return done.returncode, done.stdout + done.stderr


def test_a_40_mib_manifest_is_reported_and_cleaned_in_bounded_memory(
    fixture_cache: Path,
) -> None:
    """Before, ls, verify and gc all died of MemoryError on it, so gc could not clean it up."""
    (key,) = CacheStore(fixture_cache).entry_keys()
    path = fixture_cache / "entries" / key / "manifest.json"
    body = json.loads(path.read_bytes().partition(b"\n")[2])
    body["graph_text"] = "x" * (40 << 20)
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
    status, out = _cli_in_bounded_memory(fixture_cache, "ls")
    assert status == 0 and "unusable" in out and "larger than" in out, out
    status, out = _cli_in_bounded_memory(fixture_cache, "verify")
    assert status == 1 and "1 unusable" in out, out
    status, out = _cli_in_bounded_memory(fixture_cache, "gc")
    assert status == 0 and "1 invalid entries" in out, out
    assert CacheStore(fixture_cache).entry_keys() == []
