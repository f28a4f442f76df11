"""Artifact files of saved runners.

They are copied between a runner's own directory and the directory a checkpoint or the
cache gives it.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from ..errors import BackendError


def copy_files(source: Path, target: Path, names: Sequence[str]) -> None:
    """Copy ``names`` from ``source`` to ``target``.

    Hard links where the file system allows: artifacts are never modified after they are
    written.
    """
    for name in names:
        src = artifact_file(source, name)
        try:
            os.link(src, target / name)
        except OSError:
            shutil.copyfile(src, target / name)


def artifact_file(directory: Path, name: object, suffix: str = "") -> Path:
    """The artifact ``name`` of a saved runner record (untrusted), checked.

    It must be a plain file name (no separator, no ``..``) ending in ``suffix``, naming a
    regular file (not a link) directly in ``directory``. Anything else raises
    :class:`BackendError`, so a record can never make a loader open a file outside the
    runner's own directory.
    """
    ok = isinstance(name, str) and name not in ("", ".", "..") and name.endswith(suffix)
    if not ok or Path(str(name)).name != name or "\\" in str(name) or "\x00" in str(name):
        raise BackendError(f"refusing artifact name {str(name)[:80]!r}: not a plain file name")
    path = directory / str(name)
    try:
        mode = path.lstat().st_mode
    except OSError as exc:
        raise BackendError(f"artifact {name!r} is missing from the saved runner") from exc
    if not stat.S_ISREG(mode):
        raise BackendError(f"artifact {name!r} is not a regular file")
    return path
