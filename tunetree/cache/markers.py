"""Per-entry marker files beside the cache's entries: invalid marks, hit counters, families.

``invalid/<key>`` says an entry (by entry id) was found unusable: readers never delete, they
mark, and gc removes what is marked. ``hits/<key>`` gets one byte per cache hit, and its mtime
is the entry's last use (gc's least-recently-used order). ``families/<family>/<key>`` (empty)
lists the entries of graphs that differ only in their sizes, so a lookup for a narrower range
finds an entry tuned for a wider one. All are written without locks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import time
import uuid
from pathlib import Path
from typing import Any

from .._util.fs import is_real_dir, read_regular
from .._util.json_io import loads_bounded

log = logging.getLogger(__name__)

MAX_MARKER_BYTES = 1 << 20
"""Largest marker file read (a real one is a few hundred bytes)."""


class EntryMarkers:
    """The ``invalid/``, ``hits/`` and ``families/`` directories of one cache root."""

    def __init__(self, invalid: Path, hits: Path, families: Path) -> None:
        self.invalid = invalid
        self.hits = hits
        self.families = families

    def mark_invalid(self, key: str, entry_id: str | None, reason: str) -> None:
        """Record that an entry is unusable; never deletes it (readers only mark)."""
        try:
            part = self.invalid / f".{key}.{uuid.uuid4().hex[:8]}"
            part.write_text(json.dumps({"entry_id": entry_id, "reason": reason, "at": time.time()}))
            os.replace(part, self.invalid / key)
        except OSError as exc:
            log.debug("cannot mark %s invalid: %s", key, exc)

    def invalid_marker(self, key: str) -> dict[str, Any] | None:
        """The invalid marker of ``key`` as JSON data, or None when absent or unreadable."""
        try:
            raw = read_regular(self.invalid / key, MAX_MARKER_BYTES)
            data = loads_bounded(raw, MAX_MARKER_BYTES)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def is_marked_invalid(self, key: str, entry_id: str) -> bool:
        """True when ``key`` is marked invalid for this very entry (same ``entry_id``)."""
        marker = self.invalid_marker(key)
        return marker is not None and marker.get("entry_id") == entry_id

    def record_hit(self, key: str) -> None:
        """Append one byte to ``hits/<key>`` (O_APPEND: no lock needed)."""
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(self.hits / key, flags, 0o644)
            try:
                os.write(fd, b".")
            finally:
                os.close(fd)
        except OSError as exc:
            log.debug("cannot count a hit of %s: %s", key, exc)

    def touch_hits(self, key: str) -> None:
        """Create ``hits/<key>`` (no hit yet) so the entry's last use starts now."""
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
            os.close(os.open(self.hits / key, flags, 0o644))
        except OSError as exc:
            log.debug("cannot create the hit counter of %s: %s", key, exc)

    def forget(self, key: str) -> None:
        """Remove ``key``'s invalid marker and hit counter (its entry is gone)."""
        (self.invalid / key).unlink(missing_ok=True)
        (self.hits / key).unlink(missing_ok=True)

    def add_to_family(self, family: str, key: str) -> None:
        """Record that the entry ``key`` belongs to ``family`` (same graph but for sizes)."""
        if not (_is_name(family) and _is_name(key)):
            return
        try:
            directory = self.families / family
            directory.mkdir(exist_ok=True)
            if not is_real_dir(directory):
                raise OSError(f"families/{family} is not a directory")
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
            os.close(os.open(directory / key, flags, 0o644))
        except OSError as exc:
            log.debug("cannot add %s to family %s: %s", key, family, exc)

    def family_members(self, family: str, limit: int = 256) -> list[str]:
        """Keys of the entries recorded in ``family`` (at most ``limit``; empty when unreadable)."""
        directory = self.families / family
        if not _is_name(family) or not is_real_dir(directory):
            return []
        try:
            names = sorted(p.name for p in directory.iterdir() if _is_name(p.name))
        except OSError:
            return []
        return names[:limit]

    def prune_families(self, entries: Path) -> int:
        """Remove stale and irregular family records, and empty families; returns how many.

        Stale: its entry is gone. Irregular: not a regular record (a folder, FIFO, link,
        device, or a file of another name). Nothing is opened: a FIFO opened for reading
        would block.
        """
        removed = 0
        try:
            families = list(self.families.iterdir())
        except OSError:
            return 0
        for directory in families:
            if not is_real_dir(directory):
                _remove_entry(directory)
                continue
            try:
                records = list(directory.iterdir())
            except OSError:
                continue
            for record in records:
                regular = _is_name(record.name) and _is_regular(record)
                if not regular or not (entries / record.name).exists():
                    removed += _remove_entry(record)
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty
        return removed


def _is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file itself (not a link, folder, FIFO or device)."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _remove_entry(path: Path) -> int:
    """Remove ``path`` (a folder with what it holds) without opening or following it.

    Returns 1 when it went, 0 when it could not be removed (logged).
    """
    try:
        if is_real_dir(path):
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("tuning cache: cannot remove %s: %s", path, exc)
        return 0
    return 1


def _is_name(text: str) -> bool:
    """True for a key or family name as the cache writes them (lowercase hex)."""
    return 0 < len(text) <= 64 and all(c in "0123456789abcdef" for c in text)
