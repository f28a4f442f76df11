"""Directories that refuse writes for real, also to root (who ignores permission bits).

As another user a directory's mode is enough. Root ignores it, so there the directory is made
immutable (``chattr +i``: not even root may create, remove or rename in it, until ``-i``); a
test is skipped where the filesystem or the container does not allow that.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _chattr(flag: str, path: Path) -> bool:
    binary = shutil.which("chattr")
    if binary is None:
        return False
    done = subprocess.run([binary, flag, str(path)], capture_output=True, check=False)
    return done.returncode == 0


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """``path`` (a directory) refuses new entries inside the block, whoever the process is."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if not _chattr("+i", path):
        pytest.skip("running as root where chattr +i is not allowed: cannot refuse writes")
    try:
        yield
    finally:
        _chattr("-i", path)
