"""Small filesystem helpers shared by the checkpoint writer and the tuning cache."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable. Best effort: a filesystem that cannot
    fsync a directory (or a platform without directory descriptors) is not an error, since
    the rename itself has already happened atomically."""
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
