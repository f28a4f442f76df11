"""The tuning cache on disk: immutable entries, content-addressed artifacts, no reader locks.

Layout under the cache root::

    entries/<key>/manifest.json   the entry: first line sha256 of the rest, then JSON
    entries/<key>/placed.txt      artifacts the writer placed (its journal, for gc)
    artifacts/<ab>/<sha256>       every artifact file once, by content (read-only)
    tmp/<what>.<host>.<pid>.<id>  writers' staging entries and readers' load directories
    invalid/<key>                 marker: this entry (by entry id) was found unusable
    hits/<key>                    one byte per cache hit; its mtime is the last use
    families/<family>/<key>       entries whose graphs differ only in sizes (ranges)
                                  (the last three written by :class:`.markers.EntryMarkers`)
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
import uuid
from collections.abc import Callable
from pathlib import Path

from .._util.fs import fsync_dir, is_real_dir, read_regular
from .._util.json_io import loads_bounded
from ..errors import CacheError
from ..runtime.artifacts import FileRecord, file_sha256, remove_tree
from .entry import EntryFault, EntryManifest, EntryMissing
from .markers import EntryMarkers

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
JOURNAL = "placed.txt"
ORPHAN_AGE_S = 24 * 3600.0
"""A temporary of another host (whose writer we cannot ask about) is an orphan after this."""

MAX_MANIFEST_BYTES = 16 << 20
"""Largest entry manifest read (a real one is a few KiB; the remote's envelopes are bounded
alike); parsing one costs a few times its size (:mod:`tunetree._util.json_io`)."""
MAX_SMALL_BYTES = 1 << 20
"""Unit for the largest journal read (64 of these)."""

HOST = socket.gethostname().replace(".", "-").replace(os.sep, "-") or "host"


def encode_manifest(manifest: EntryManifest) -> bytes:
    """A manifest file's bytes: the sha256 of the JSON body on the first line, then the body."""
    data = json.dumps(manifest.to_json(), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest().encode() + b"\n" + data


def decode_manifest(raw: bytes, key: str) -> EntryManifest:
    """The validated manifest in a manifest file's bytes (the remote tier's too).

    EntryFault when truncated, corrupted or not JSON; MalformedEntryError naming a field.
    """
    head, sep, data = raw.partition(b"\n")
    if not sep or hashlib.sha256(data).hexdigest().encode() != head:
        raise EntryFault(f"the manifest of {key} is truncated or corrupted (checksum)")
    try:
        body = loads_bounded(data, MAX_MANIFEST_BYTES)
    except ValueError as exc:
        raise EntryFault(f"the manifest of {key} is not JSON: {exc}") from exc
    return EntryManifest.from_json(body, key)


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
        self.families = self.root / "families"
        try:
            for d in (
                self.entries,
                self.artifacts,
                self.tmp,
                self.invalid,
                self.hits,
                self.trash,
                self.locks,
                self.families,
            ):
                d.mkdir(parents=True, exist_ok=True)
                if not is_real_dir(d):
                    raise OSError(f"{d.name}/ is not a directory (a symbolic link?)")
        except OSError as exc:
            raise CacheError(f"cannot use {self.root} as a tuning cache: {exc}") from exc
        self.markers = EntryMarkers(self.invalid, self.hits, self.families)

    # ------------------------------------------------------------------ staging

    def new_temporary(self, what: str) -> Path:
        """A fresh directory under ``tmp/`` named after this host and process.

        The name lets gc tell a dead writer's leftovers from a live one's.
        """
        path = self.tmp / f"{what}.{HOST}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
        path.mkdir()
        return path

    def artifact_path(self, sha: str) -> Path:
        """Where the artifact with sha256 ``sha`` is stored (sharded by its first two chars)."""
        return self.artifacts / sha[:2] / sha

    def artifact_stat(self, sha: str) -> os.stat_result:
        """``lstat`` of an artifact, which must be a regular file in a real shard directory.

        No symbolic link is allowed anywhere below the root; OSError otherwise.
        """
        path = self.artifact_path(sha)
        if not is_real_dir(path.parent):
            raise OSError(f"artifact shard {path.parent.name} is not a directory")
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"artifact {sha[:12]} is not a regular file")
        return st

    def put_artifact(self, source: Path, journal: Path) -> tuple[str, int]:
        """Move ``source`` (a file inside a staging directory) into content-addressed storage.

        Returns its sha256 and size. The sha is journaled before the artifact appears, and the
        artifact's mtime is refreshed, so a concurrent gc never removes it.
        """
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

    def keep_artifacts(self, files: list[FileRecord], journal: Path) -> None:
        """Journal artifacts a new entry reuses from an older one and refresh their mtime.

        So a gc running while the older entry is replaced keeps them.
        """
        with open(journal, "a", encoding="utf-8") as f:
            f.write("".join(ref.sha256 + "\n" for ref in files))
        for ref in files:
            with contextlib.suppress(OSError):
                os.utime(self.artifact_path(ref.sha256))

    def write_manifest(self, directory: Path, manifest: EntryManifest) -> None:
        """Write ``manifest.json``: the sha256 of the JSON body on the first line, then the body.

        Written to a side file and renamed, so a manifest is complete or absent.
        """
        text = encode_manifest(manifest)
        part = directory / (MANIFEST + ".part")
        with open(part, "wb") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, directory / MANIFEST)
        fsync_dir(directory)

    def publish(
        self, staging: Path, key: str, keep_existing: Callable[[EntryManifest], bool]
    ) -> bool:
        """Rename a complete staging directory to ``entries/<key>``.

        When an entry is already there and ``keep_existing(its body)`` holds (it is valid for us),
        ours is discarded and False returned; an unusable one is moved to trash and replaced.
        """
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
                self.check_files(body.referenced(), deep=True)
                usable = keep_existing(body) and not self.markers.is_marked_invalid(
                    key, body.entry_id
                )
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

    def read_manifest(self, key: str) -> EntryManifest:
        """The checked, validated manifest of ``key``.

        Raises :class:`EntryMissing` when there is no entry and :class:`EntryFault` when its
        manifest is truncated, corrupted or malformed (:class:`MalformedEntryError`, naming the
        field).
        """
        path = self.entries / key / MANIFEST
        try:
            if (self.entries / key).is_symlink():
                raise EntryFault(f"entry {key} is a symbolic link")
            raw = read_regular(path, MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            if (self.entries / key).exists():
                raise EntryFault(f"entry {key} has no manifest") from None
            raise EntryMissing(f"no entry {key}") from None
        except OSError as exc:
            raise EntryFault(f"cannot read the manifest of {key}: {exc}") from exc
        return decode_manifest(raw, key)

    def check_files(self, files: list[FileRecord], deep: bool) -> None:
        """Every artifact exists with its size (and, when ``deep``, its sha256)."""
        for ref in files:
            sha, size = ref.sha256, ref.size
            path = self.artifact_path(sha) if len(sha) == 64 else None
            try:
                actual = self.artifact_stat(sha).st_size if path is not None else -1
            except OSError:
                actual = -1
            if path is None or actual < 0:
                raise EntryFault(f"artifact {sha[:12]} ({ref.path}) is missing")
            if actual != size:
                raise EntryFault(
                    f"artifact {sha[:12]} ({ref.path}) is truncated: {actual} of {size} bytes"
                )
            if deep and file_sha256(path)[0] != sha:
                raise EntryFault(f"artifact {sha[:12]} ({ref.path}) is corrupted")

    def materialize(self, files: list[FileRecord]) -> Path:
        """A fresh directory holding ``files`` under their saved paths, each checked by sha256.

        The files are hard links to the read-only artifacts, copies where links fail.
        """
        target = self.new_temporary("load")
        try:
            self.check_files(files, deep=False)
            for ref in files:
                rel = Path(ref.path)
                if rel.is_absolute() or ".." in rel.parts:
                    raise EntryFault(f"artifact path {rel} leaves its directory")
                dest = target / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                source = self.artifact_path(ref.sha256)
                try:
                    os.link(source, dest)
                except OSError:
                    shutil.copyfile(source, dest)
                if file_sha256(dest)[0] != ref.sha256:
                    raise EntryFault(f"artifact {ref.sha256[:12]} ({rel}) is corrupted")
        except FileNotFoundError as exc:
            remove_tree(target)
            raise EntryFault(f"an artifact vanished while loading: {exc}") from exc
        except BaseException:
            remove_tree(target)
            raise
        return target

    # ------------------------------------------------------------------ listing

    def entry_keys(self) -> list[str]:
        """Keys of the stored entries, sorted (empty when unreadable)."""
        try:
            return sorted(p.name for p in self.entries.iterdir() if not p.name.startswith("."))
        except OSError:
            return []

    def size(self) -> int:
        """Bytes under the root (entries, artifacts, temporaries, trash)."""
        total = 0
        for directory, _, files in os.walk(self.root):  # vanishing files are skipped
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(directory, name)).st_size
        return total

    def entry_dir_size(self, key: str) -> int:
        """Bytes (``lstat`` sizes) of what lies directly in ``entries/<key>``."""
        total = 0
        with contextlib.suppress(OSError):
            for p in (self.entries / key).iterdir():
                total += p.lstat().st_size
        return total

    def artifact_size(self, sha: str) -> int:
        """Bytes of the artifact with sha256 ``sha`` (0 when missing or not a regular file)."""
        try:
            return self.artifact_stat(sha).st_size
        except OSError:
            return 0
