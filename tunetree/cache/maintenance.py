"""Looking after a cache store: per-entry summaries, orphans of dead writers, and gc.

Separate from :mod:`tunetree.cache.store` (which only reads and writes entries) because
these walk the whole cache; every function is safe with concurrent processes.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .._util.fs import read_regular
from ..runtime.artifacts import remove_tree
from .entry import EntryFault
from .store import HOST, JOURNAL, MAX_SMALL_BYTES, ORPHAN_AGE_S, CacheStore


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class EntryInfo:
    """One entry as ``tunetree cache ls`` shows it."""

    key: str
    path: str = ""
    graph: str = ""
    winner: str = ""
    candidates: int = 0
    size: int = 0
    hits: int = 0
    created: float = 0.0
    last_used: float = 0.0
    problem: str | None = None
    artifacts: list[str] = field(default_factory=list)


@dataclass
class GcReport:
    """What ``gc`` removed."""

    temporaries: int = 0
    invalid_entries: int = 0
    evicted_entries: int = 0
    artifacts: int = 0
    trash: int = 0
    family_records: int = 0
    """Family records removed: of entries that are gone, or not regular records."""
    freed_bytes: int = 0
    size_before: int = 0
    size_after: int = 0


def entry_info(store: CacheStore, key: str, deep: bool = False) -> EntryInfo:
    """One entry's summary; ``problem`` says why it is unusable (checksums when ``deep``)."""
    info = EntryInfo(key)
    directory = store.entries / key
    info.size = store.entry_dir_size(key)
    try:
        hits = (store.hits / key).stat()
        info.hits, info.last_used = hits.st_size, hits.st_mtime
    except OSError:
        pass
    try:
        body = store.read_manifest(key)
    except EntryFault as exc:
        info.problem = str(exc)
        with contextlib.suppress(OSError):
            info.created = directory.stat().st_mtime
        info.last_used = info.last_used or info.created
        return info
    info.path, info.graph = body.path, body.graph_text
    info.created = body.created
    info.last_used = info.last_used or info.created
    info.candidates = len(body.candidates)
    info.winner = "none" if body.winner is None else body.candidates[body.winner].name
    refs = body.referenced()
    info.artifacts = sorted({r.sha256 for r in refs})
    info.size += sum(r.size for r in {r.sha256: r for r in refs}.values())
    if store.markers.is_marked_invalid(key, body.entry_id):
        marker = store.markers.invalid_marker(key) or {}
        info.problem = f"marked invalid: {marker.get('reason', '')}"
    try:
        store.check_files(body.referenced(), deep=deep)
    except EntryFault as exc:
        info.problem = str(exc)
    return info


def temporaries(store: CacheStore) -> Iterator[tuple[Path, bool]]:
    """Every staging or load directory, and whether its owner is gone."""
    now = time.time()
    try:
        items = list(store.tmp.iterdir())
    except OSError:
        return
    for path in items:
        parts = path.name.split(".")
        dead = False
        if len(parts) == 4 and parts[2].isdigit():
            _, host, pid, _ = parts
            if host == HOST:
                dead = not _pid_alive(int(pid))
            else:
                with contextlib.suppress(OSError):
                    dead = now - path.stat().st_mtime > ORPHAN_AGE_S
        else:
            dead = True
        yield path, dead


def gc(store: CacheStore, max_size: int | None = None) -> GcReport:
    """Remove orphans, trash, invalid and least-recently-used entries, then unreferenced artifacts.

    In that order: orphaned temporaries of dead writers, trash, invalid entries, then
    least-recently-used entries until the cache fits ``max_size`` bytes, then every artifact no
    entry or live writer references.
    """
    report = GcReport(size_before=store.size())
    start = time.time()
    protected = _clear_temporaries(store, report)
    infos = _drop_invalid(store, report)

    if max_size is not None:
        report.evicted_entries = _evict(store, infos, max_size)

    for key in store.entry_keys():  # entries published while we worked count too
        if key not in infos:
            with contextlib.suppress(EntryFault):
                protected.update(r.sha256 for r in store.read_manifest(key).referenced())
    referenced = protected | {sha for i in infos.values() for sha in i.artifacts}
    report.artifacts = _sweep_artifacts(store, referenced, start)
    with contextlib.suppress(OSError):
        for path in store.hits.iterdir():
            if not (store.entries / path.name).exists():
                path.unlink(missing_ok=True)
    report.family_records = store.markers.prune_families(store.entries)
    report.size_after = store.size()
    report.freed_bytes = max(0, report.size_before - report.size_after)
    return report


def _clear_temporaries(store: CacheStore, report: GcReport) -> set[str]:
    """Remove dead writers' temporaries and the trash.

    Returns the artifacts that live writers' journals still claim.
    """
    protected: set[str] = set()
    for path, dead in temporaries(store):
        if dead:
            remove_tree(path)
            report.temporaries += 1
        else:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                journal = read_regular(path / JOURNAL, MAX_SMALL_BYTES * 64)
                protected.update(journal.decode("ascii").split())
    with contextlib.suppress(OSError):
        for path in store.trash.iterdir():
            remove_tree(path)
            report.trash += 1
    return protected


def _drop_invalid(store: CacheStore, report: GcReport) -> dict[str, EntryInfo]:
    """Remove entries with a problem and stale invalid marks; returns the sound entries."""
    infos = {key: entry_info(store, key) for key in store.entry_keys()}
    for key, info in list(infos.items()):
        if info.problem is not None:
            remove_entry(store, key)
            report.invalid_entries += 1
            del infos[key]
    with contextlib.suppress(OSError):
        for path in store.invalid.iterdir():
            if path.name not in infos:
                path.unlink(missing_ok=True)
    return infos


def _evict(store: CacheStore, infos: dict[str, EntryInfo], max_size: int) -> int:
    """Remove least-recently-used entries (from ``infos`` too) until the cache fits ``max_size``.

    The entries and the artifacts they reference must fit ``max_size`` bytes. Returns how many were
    removed.
    """
    sizes = {sha: store.artifact_size(sha) for i in infos.values() for sha in i.artifacts}
    total = sum(store.entry_dir_size(k) for k in infos) + sum(sizes.values())
    evicted = 0
    for key, _info in sorted(infos.items(), key=lambda kv: _when_used(kv[1])):
        if total <= max_size:
            break
        remove_entry(store, key)
        evicted += 1
        del infos[key]
        still = {sha for i in infos.values() for sha in i.artifacts}
        total = sum(store.entry_dir_size(k) for k in infos) + sum(
            size for sha, size in sizes.items() if sha in still
        )
    return evicted


def _when_used(info: EntryInfo) -> float:
    """Its last use for eviction: a time no clock shows (NaN, infinite) counts as the oldest."""
    return info.last_used if math.isfinite(info.last_used) else float("-inf")


def _sweep_artifacts(store: CacheStore, referenced: set[str], start: float) -> int:
    """Delete artifacts nothing references that are older than this gc; returns how many."""
    removed = 0
    for path in _artifact_files(store):
        if path.name in referenced:
            continue
        try:
            st = path.lstat()
        except OSError:
            continue
        if st.st_mtime >= start:
            continue  # placed after gc began by a writer gc did not see yet
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def _artifact_files(store: CacheStore) -> list[Path]:
    """Files under the artifact shards, never through a symbolic link.

    A linked shard (or anything not a directory) is skipped, so gc deletes nothing outside the
    cache.
    """
    files: list[Path] = []
    with contextlib.suppress(OSError):
        for shard in os.scandir(store.artifacts):
            if not shard.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                files += [Path(f.path) for f in os.scandir(shard.path)]
    return files


def remove_entry(store: CacheStore, key: str) -> None:
    """Remove the entry of ``key`` (via the trash) with its invalid marker and hit counts."""
    trash = store.trash / f"{key}.{uuid.uuid4().hex[:8]}"
    try:
        os.rename(store.entries / key, trash)
    except FileNotFoundError:
        return
    remove_tree(trash)
    store.markers.forget(key)
