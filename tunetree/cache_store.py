"""The tuning cache on disk: immutable entries, content-addressed artifacts, no reader locks.

Layout under the cache root::

    entries/<key>/manifest.json   the entry: first line sha256 of the rest, then JSON
    entries/<key>/placed.txt      artifacts the writer placed (its journal, for gc)
    artifacts/<ab>/<sha256>       every artifact file once, by content (read-only)
    tmp/<what>.<host>.<pid>.<id>  writers' staging entries and readers' load directories
    invalid/<key>                 marker: this entry (by entry id) was found unusable
    hits/<key>                    one byte per cache hit; its mtime is the last use
    trash/                        entries moved aside by writers or gc, deleted by gc
    locks/                        per-key writer locks and per-device profiling locks

A writer fills ``tmp/entry...``: it saves artifacts into ``artifacts/`` (journaling each
one first), writes the manifest **last**, and renames the directory to ``entries/<key>``.
When that name exists, the existing entry wins if it is valid; the writer then discards
its own. Readers never lock and never delete: a fault marks the entry invalid. ``gc``
deletes what no entry references: invalid entries, trash, orphaned temporaries of dead
writers, unreferenced artifacts, and least-recently-used entries beyond a size limit.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._fs import fsync_dir
from .errors import CacheError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
JOURNAL = "placed.txt"
ORPHAN_AGE_S = 24 * 3600.0
"""A temporary of another host (whose writer we cannot ask about) is an orphan after this."""

_HOST = socket.gethostname().replace(".", "-").replace(os.sep, "-") or "host"


class EntryFault(CacheError):
    """An entry cannot be used: missing or corrupt files, another schema or environment."""


class EntryMissing(EntryFault):
    """No entry under this key (a plain miss)."""


def file_sha256(path: Path) -> tuple[str, int]:
    """sha256 and size of a file, read in blocks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_tree(path: Path) -> None:
    def writable(func: Callable[..., Any], p: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            os.chmod(p, stat.S_IRWXU)
            func(p)

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=writable)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


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
    freed_bytes: int = 0
    size_before: int = 0
    size_after: int = 0


class CacheStore:
    """Files of one cache root. Every method is safe with concurrent processes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser()
        self.entries = self.root / "entries"
        self.artifacts = self.root / "artifacts"
        self.tmp = self.root / "tmp"
        self.invalid = self.root / "invalid"
        self.hits = self.root / "hits"
        self.trash = self.root / "trash"
        self.locks = self.root / "locks"
        try:
            for d in (
                self.entries,
                self.artifacts,
                self.tmp,
                self.invalid,
                self.hits,
                self.trash,
                self.locks,
            ):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot use {self.root} as a tuning cache: {exc}") from exc

    # ------------------------------------------------------------------ staging

    def new_temporary(self, what: str) -> Path:
        """A fresh directory under ``tmp/`` named after this host and process (so gc can
        tell a dead writer's leftovers from a live one's)."""
        path = self.tmp / f"{what}.{_HOST}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
        path.mkdir()
        return path

    def artifact_path(self, sha: str) -> Path:
        return self.artifacts / sha[:2] / sha

    def put_artifact(self, source: Path, journal: Path) -> tuple[str, int]:
        """Move ``source`` (a file inside a staging directory) into content-addressed storage;
        returns its sha256 and size. The sha is journaled before the artifact appears, and
        the artifact's mtime is refreshed, so a concurrent gc never removes it."""
        sha, size = file_sha256(source)
        with open(journal, "a", encoding="utf-8") as f:
            f.write(sha + "\n")
            f.flush()
        dest = self.artifact_path(sha)
        dest.parent.mkdir(exist_ok=True)
        with open(source, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(source, 0o444)
        os.utime(source)
        # Replacing an existing artifact of the same name is harmless (same content) and
        # heals one that was corrupted on disk; readers holding the old file keep it.
        os.replace(source, dest)
        return sha, size

    def keep_artifacts(self, files: list[dict[str, Any]], journal: Path) -> None:
        """Journal artifacts a new entry reuses from an older one and refresh their mtime,
        so a gc running while the older entry is replaced keeps them."""
        with open(journal, "a", encoding="utf-8") as f:
            f.write("".join(str(ref["sha256"]) + "\n" for ref in files))
        for ref in files:
            with contextlib.suppress(OSError):
                os.utime(self.artifact_path(str(ref["sha256"])))

    def write_manifest(self, directory: Path, body: dict[str, Any]) -> None:
        """Write ``manifest.json``: the sha256 of the JSON body on the first line, then the
        body. Written to a side file and renamed, so a manifest is complete or absent."""
        data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        text = hashlib.sha256(data).hexdigest().encode() + b"\n" + data
        part = directory / (MANIFEST + ".part")
        with open(part, "wb") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, directory / MANIFEST)
        fsync_dir(directory)

    def publish(
        self, staging: Path, key: str, keep_existing: Callable[[dict[str, Any]], bool]
    ) -> bool:
        """Rename a complete staging directory to ``entries/<key>``. When an entry is already
        there and ``keep_existing(its body)`` holds (it is valid for us), ours is discarded
        and False returned; an unusable one is moved to trash and replaced."""
        final = self.entries / key
        for _ in range(5):
            try:
                os.rename(staging, final)
                fsync_dir(self.entries)
                return True
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                    raise
            try:
                body = self.read_manifest(key)
                self.check_files(body, deep=True)
                usable = keep_existing(body) and not self.is_marked_invalid(key, body)
            except EntryMissing:
                continue  # it vanished (moved by gc or another writer): try again
            except EntryFault:
                usable = False
            if usable:
                remove_tree(staging)
                return False
            self.retire(key)
        raise CacheError(f"could not publish entry {key}: the name stays taken")

    def retire(self, key: str) -> None:
        """Move the entry under ``key`` to trash (a writer or gc replacing or removing it)."""
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.entries / key, self.trash / f"{key}.{uuid.uuid4().hex[:8]}")

    # ------------------------------------------------------------------ reading

    def read_manifest(self, key: str) -> dict[str, Any]:
        """The checked manifest body of ``key``. Raises :class:`EntryMissing` when there is
        no entry and :class:`EntryFault` when its manifest is truncated or corrupted."""
        path = self.entries / key / MANIFEST
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            if (self.entries / key).exists():
                raise EntryFault(f"entry {key} has no manifest") from None
            raise EntryMissing(f"no entry {key}") from None
        except OSError as exc:
            raise EntryFault(f"cannot read the manifest of {key}: {exc}") from exc
        head, sep, data = raw.partition(b"\n")
        if not sep or hashlib.sha256(data).hexdigest().encode() != head:
            raise EntryFault(f"the manifest of {key} is truncated or corrupted (checksum)")
        try:
            body = json.loads(data)
        except ValueError as exc:
            raise EntryFault(f"the manifest of {key} is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise EntryFault(f"the manifest of {key} is not an object")
        return body

    @staticmethod
    def referenced(body: dict[str, Any]) -> list[dict[str, Any]]:
        """Every artifact file an entry references (its dependency edges to artifacts)."""
        files = []
        for candidate in body.get("candidates", []):
            artifact = candidate.get("artifact") or {}
            files.extend(artifact.get("files", []))
        return files

    def check_files(
        self, body: dict[str, Any], deep: bool, files: list[dict[str, Any]] | None = None
    ) -> None:
        """Every referenced artifact exists with its size (and, when ``deep``, its sha256)."""
        for ref in self.referenced(body) if files is None else files:
            sha, size = str(ref.get("sha256", "")), ref.get("size")
            path = self.artifact_path(sha) if len(sha) == 64 else None
            try:
                actual = path.stat().st_size if path is not None else -1
            except OSError:
                actual = -1
            if path is None or actual < 0:
                raise EntryFault(f"artifact {sha[:12]} ({ref.get('path')}) is missing")
            if actual != size:
                raise EntryFault(
                    f"artifact {sha[:12]} ({ref.get('path')}) is truncated: {actual} of "
                    f"{size} bytes"
                )
            if deep and file_sha256(path)[0] != sha:
                raise EntryFault(f"artifact {sha[:12]} ({ref.get('path')}) is corrupted")

    def materialize(self, files: list[dict[str, Any]]) -> Path:
        """A fresh directory holding ``files`` under their saved relative paths (hard links
        to the read-only artifacts, copies where links fail), each checked by sha256."""
        target = self.new_temporary("load")
        try:
            self.check_files({}, deep=False, files=files)
            for ref in files:
                rel = Path(str(ref["path"]))
                if rel.is_absolute() or ".." in rel.parts:
                    raise EntryFault(f"artifact path {rel} leaves its directory")
                dest = target / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                source = self.artifact_path(str(ref["sha256"]))
                try:
                    os.link(source, dest)
                except OSError:
                    shutil.copyfile(source, dest)
                if file_sha256(dest)[0] != ref["sha256"]:
                    raise EntryFault(f"artifact {str(ref['sha256'])[:12]} ({rel}) is corrupted")
        except FileNotFoundError as exc:
            remove_tree(target)
            raise EntryFault(f"an artifact vanished while loading: {exc}") from exc
        except BaseException:
            remove_tree(target)
            raise
        return target

    # ------------------------------------------------------------------ markers and stats

    def mark_invalid(self, key: str, entry_id: str | None, reason: str) -> None:
        """Record that an entry is unusable; never deletes it (readers only mark)."""
        try:
            part = self.invalid / f".{key}.{uuid.uuid4().hex[:8]}"
            part.write_text(json.dumps({"entry_id": entry_id, "reason": reason, "at": time.time()}))
            os.replace(part, self.invalid / key)
        except OSError as exc:
            log.debug("cannot mark %s invalid: %s", key, exc)

    def invalid_marker(self, key: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.invalid / key).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def is_marked_invalid(self, key: str, body: dict[str, Any]) -> bool:
        marker = self.invalid_marker(key)
        return marker is not None and marker.get("entry_id") == body.get("entry_id")

    def record_hit(self, key: str) -> None:
        """Append one byte to ``hits/<key>`` (O_APPEND: no lock needed)."""
        try:
            fd = os.open(self.hits / key, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, b".")
            finally:
                os.close(fd)
        except OSError as exc:
            log.debug("cannot count a hit of %s: %s", key, exc)

    def touch_hits(self, key: str) -> None:
        """Create ``hits/<key>`` (no hit yet) so the entry's last use starts now."""
        try:
            (self.hits / key).touch()
        except OSError as exc:
            log.debug("cannot create the hit counter of %s: %s", key, exc)

    # ------------------------------------------------------------------ tools

    def entry_keys(self) -> list[str]:
        try:
            return sorted(p.name for p in self.entries.iterdir() if not p.name.startswith("."))
        except OSError:
            return []

    def entry_info(self, key: str, deep: bool = False) -> EntryInfo:
        """One entry's summary; ``problem`` says why it is unusable (checksums when ``deep``)."""
        info = EntryInfo(key)
        directory = self.entries / key
        info.size = self._entry_dir_size(key)
        try:
            hits = (self.hits / key).stat()
            info.hits, info.last_used = hits.st_size, hits.st_mtime
        except OSError:
            pass
        try:
            body = self.read_manifest(key)
        except EntryFault as exc:
            info.problem = str(exc)
            with contextlib.suppress(OSError):
                info.created = directory.stat().st_mtime
            info.last_used = info.last_used or info.created
            return info
        info.path = str(body.get("path", ""))
        info.graph = str(body.get("graph_text", ""))
        info.created = float(body.get("created", 0.0))
        info.last_used = info.last_used or info.created
        info.candidates = len(body.get("candidates", []))
        winner = body.get("winner")
        if isinstance(winner, int) and 0 <= winner < info.candidates:
            info.winner = str(body["candidates"][winner].get("name", ""))
        else:
            info.winner = "none"
        refs = self.referenced(body)
        info.artifacts = sorted({str(r.get("sha256")) for r in refs})
        info.size += sum(int(r.get("size") or 0) for r in {r["sha256"]: r for r in refs}.values())
        if self.is_marked_invalid(key, body):
            marker = self.invalid_marker(key) or {}
            info.problem = f"marked invalid: {marker.get('reason', '')}"
        try:
            self.check_files(body, deep=deep)
        except EntryFault as exc:
            info.problem = str(exc)
        return info

    def size(self) -> int:
        """Bytes under the root (entries, artifacts, temporaries, trash)."""
        total = 0
        for directory, _, files in os.walk(self.root):  # vanishing files are skipped
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(directory, name)).st_size
        return total

    def _temporaries(self) -> Iterator[tuple[Path, bool]]:
        """Every staging or load directory, and whether its owner is gone."""
        now = time.time()
        try:
            items = list(self.tmp.iterdir())
        except OSError:
            return
        for path in items:
            parts = path.name.split(".")
            dead = False
            if len(parts) == 4 and parts[2].isdigit():
                _, host, pid, _ = parts
                if host == _HOST:
                    dead = not _pid_alive(int(pid))
                else:
                    with contextlib.suppress(OSError):
                        dead = now - path.stat().st_mtime > ORPHAN_AGE_S
            else:
                dead = True
            yield path, dead

    def gc(self, max_size: int | None = None) -> GcReport:
        """Remove orphaned temporaries of dead writers, trash, invalid entries, then
        least-recently-used entries until the cache fits ``max_size`` bytes, then every
        artifact no entry or live writer references."""
        report = GcReport(size_before=self.size())
        start = time.time()
        protected: set[str] = set()
        for path, dead in self._temporaries():
            if dead:
                remove_tree(path)
                report.temporaries += 1
            else:
                with contextlib.suppress(OSError):
                    protected.update((path / JOURNAL).read_text().split())
        with contextlib.suppress(OSError):
            for path in self.trash.iterdir():
                remove_tree(path)
                report.trash += 1

        infos = {key: self.entry_info(key) for key in self.entry_keys()}
        for key, info in list(infos.items()):
            if info.problem is not None:
                self._remove_entry(key)
                report.invalid_entries += 1
                del infos[key]
        with contextlib.suppress(OSError):
            for path in self.invalid.iterdir():
                if path.name not in infos:
                    path.unlink(missing_ok=True)

        if max_size is not None:
            sizes = {sha: self._artifact_size(sha) for i in infos.values() for sha in i.artifacts}
            total = sum(self._entry_dir_size(k) for k in infos) + sum(sizes.values())
            for key, _info in sorted(infos.items(), key=lambda kv: kv[1].last_used):
                if total <= max_size:
                    break
                self._remove_entry(key)
                report.evicted_entries += 1
                del infos[key]
                still = {sha for i in infos.values() for sha in i.artifacts}
                total = sum(self._entry_dir_size(k) for k in infos) + sum(
                    size for sha, size in sizes.items() if sha in still
                )

        for key in self.entry_keys():  # entries published while we worked count too
            if key not in infos:
                with contextlib.suppress(EntryFault):
                    protected.update(r["sha256"] for r in self.referenced(self.read_manifest(key)))
        referenced = protected | {sha for i in infos.values() for sha in i.artifacts}
        for path in list(self.artifacts.glob("*/*")):
            if path.name in referenced:
                continue
            try:
                st = path.stat()
            except OSError:
                continue
            if st.st_mtime >= start:
                continue  # placed after gc began by a writer gc did not see yet
            path.unlink(missing_ok=True)
            report.artifacts += 1
        with contextlib.suppress(OSError):
            for path in self.hits.iterdir():
                if not (self.entries / path.name).exists():
                    path.unlink(missing_ok=True)
        report.size_after = self.size()
        report.freed_bytes = max(0, report.size_before - report.size_after)
        return report

    def _remove_entry(self, key: str) -> None:
        trash = self.trash / f"{key}.{uuid.uuid4().hex[:8]}"
        try:
            os.rename(self.entries / key, trash)
        except FileNotFoundError:
            return
        remove_tree(trash)
        (self.invalid / key).unlink(missing_ok=True)
        (self.hits / key).unlink(missing_ok=True)

    def _entry_dir_size(self, key: str) -> int:
        total = 0
        with contextlib.suppress(OSError):
            for p in (self.entries / key).iterdir():
                total += p.stat().st_size
        return total

    def _artifact_size(self, sha: str) -> int:
        try:
            return self.artifact_path(sha).stat().st_size
        except OSError:
            return 0
