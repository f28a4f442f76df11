"""Small filesystem helpers shared by the checkpoint writer and the tuning cache."""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable, on a best-effort basis.

    A filesystem that cannot fsync a directory (or a platform without directory descriptors) is not
    an error, since the rename itself has already happened atomically.
    """
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_regular(path: Path, limit: int) -> bytes:
    """Read the bytes of ``path``, a regular file of at most ``limit`` bytes.

    The file must never be a symbolic link, FIFO or device: it is opened with ``O_NOFOLLOW |
    O_NONBLOCK`` and checked with ``fstat``. Raises ``OSError`` otherwise (``FileNotFoundError``
    when absent).
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        chunks = []
        size = 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(f"{path} is larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def is_real_dir(path: Path) -> bool:
    """Whether ``path`` is a directory itself (not a symbolic link to one)."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def write_atomically(directory: Path, name: str, data: bytes) -> None:
    """Write ``data`` to ``directory / name`` whole or not at all.

    The bytes go to a private file in the same directory, are synced, and replace ``name`` by
    a rename; a writer killed halfway leaves the previous file. A ``directory`` that is a
    symbolic link is refused.

    Raises:
        OSError: the directory cannot be made or is not a real one, or the write failed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    if not is_real_dir(directory):
        raise OSError(f"{directory} is not a directory (a symbolic link?)")
    part = directory / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        with open(part, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, directory / name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
    fsync_dir(directory)
