"""Artifact files of saved runners: copied between a runner's own directory and the
directory a checkpoint or the cache gives it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from ..errors import BackendError


def copy_files(source: Path, target: Path, names: Sequence[str]) -> None:
    """Copy ``names`` from ``source`` to ``target`` (hard links where the file system allows:
    artifacts are never modified after they are written)."""
    for name in names:
        if Path(name).name != name:
            raise BackendError(f"refusing artifact name {name!r}: not a plain file name")
        src = source / name
        if not src.is_file():
            raise BackendError(f"artifact {name!r} is missing from {source}")
        try:
            os.link(src, target / name)
        except OSError:
            shutil.copyfile(src, target / name)
