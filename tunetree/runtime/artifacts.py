"""Saved runners: the one artifact layer under both the tuning cache and the checkpoint.

A winning runner is persisted as a :class:`SavedRunner`: the :class:`BackendRecord` that
rebuilds its backend, the JSON description its ``save`` returned, and the files it wrote
(each with its SHA-256 and size). :func:`save_runner` writes one, :func:`load_runner`
rebuilds the runner from one; where the files are kept (a zip member, a content-addressed
cache store) is the caller's business.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._util.names import stable_name
from .._util.records import Fields
from ..backends import backend_type
from ..backends.base import Backend, Runner
from ..errors import BackendError
from ..signature.graph import GraphKey

KIND = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
"""What a backend kind in a record may look like (it names distributions to look up)."""

SHA256 = re.compile(r"[0-9a-f]{64}")
"""A SHA-256 as records hold it (it names a file in the cache's artifact store)."""

_CHUNK = 1 << 20

FLOOR_ELEMENTS = 1 << 26
"""Tensor elements a load may always allocate on a file's word (256 MiB of float32)."""
ELEMENTS_PER_BYTE = 4
"""Beyond :data:`FLOOR_ELEMENTS`, elements per byte of what the load reads (16 bytes of
float32 per byte of the file, or of the model's weights)."""


def allowed_elements(read_bytes: int) -> int:
    """Most tensor elements a load reading ``read_bytes`` bytes may allocate on their word.

    Graph shapes (placeholder inputs) and saved output shapes come from the file: a real
    file's are a few times the size of its weights at most, and a hostile one's are refused
    before anything is allocated, with memory bounded by a small multiple of the file.
    """
    return max(FLOOR_ELEMENTS, ELEMENTS_PER_BYTE * max(read_bytes, 0))


@dataclass(frozen=True)
class BackendRecord:
    """A backend as JSON: its ``kind`` and ``config`` (what rebuilds it), plus class and name.

    The class (the cache keys on it, as :func:`~tunetree._util.names.stable_name` names it:
    ``tunetree.Inductor``, never the module it lives in) and the display name (checkpoints show
    it) are kept where known.

    Reads both shapes the first release wrote: ``{kind, name, config}`` in checkpoints and
    ``{kind, class, config}`` in the cache.
    """

    kind: str
    config: dict[str, Any]
    cls: str = ""
    name: str = ""

    @classmethod
    def of(cls, backend: Backend, *, for_checkpoint: bool = False) -> BackendRecord:
        """The record of ``backend``, its config as it reads back from JSON.

        It carries the backend's class (the cache's shape), or with ``for_checkpoint`` its display
        name instead (the checkpoint's shape, unchanged since format version 1).
        """
        klass = type(backend)
        config = json.loads(json.dumps(backend.config(), sort_keys=True, allow_nan=True))
        if for_checkpoint:
            return cls(backend.kind, config, name=backend.name)
        return cls(backend.kind, config, stable_name(klass))

    def to_json(self) -> dict[str, Any]:
        """This record as JSON data; class and name only where known."""
        data: dict[str, Any] = {"kind": self.kind, "config": self.config}
        if self.cls:
            data["class"] = self.cls
        if self.name:
            data["name"] = self.name
        return data

    @classmethod
    def from_json(cls, data: Any, where: str, error: type[Exception]) -> BackendRecord:
        """Read and validate a record; a bad field raises ``error`` naming it."""
        fields = Fields(data, where, error)
        kind = fields.get("kind", str)
        if not KIND.fullmatch(kind):
            raise fields.fail("kind", f"is {kind!r}, not a backend kind")
        return cls(
            kind,
            fields.get("config", dict),
            fields.get("class", str, ""),
            fields.get("name", str, ""),
        )

    def backend(self, *, trust_config: bool = False) -> Backend:
        """The backend this record describes.

        Raises :class:`~tunetree.errors.BackendUnavailableError` for a kind this tunetree does not
        know, :class:`~tunetree.errors.UntrustedConfigError` for a config that fails the class's
        :meth:`~tunetree.backends.base.Backend.check_saved_config` (skipped with ``trust_config``:
        only for files the user wrote), and ``TypeError``/``ValueError`` for a config its class
        refuses.
        """
        cls = backend_type(self.kind)
        if not trust_config:
            cls.check_saved_config(self.config)
        return cls(**self.config)


@dataclass(frozen=True)
class FileRecord:
    """One artifact file: its path relative to the runner's directory, SHA-256 and size."""

    path: str
    sha256: str
    size: int

    def to_json(self) -> dict[str, Any]:
        """This record as JSON data."""
        return {"path": self.path, "sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, data: Any, where: str, error: type[Exception]) -> FileRecord:
        """Read a record; raises ``error`` for a bad field or a path that leaves its directory."""
        fields = Fields(data, where, error)
        size = fields.get("size", int)
        if size < 0:
            raise fields.fail("size", "is negative")
        path, sha = fields.get("path", str), fields.get("sha256", str)
        parts = path.split("/")
        if not path or "\\" in path or "\x00" in path or any(p in ("", ".", "..") for p in parts):
            raise fields.fail("path", f"is {path[:80]!r}, which leaves its directory")
        if not SHA256.fullmatch(sha):
            raise fields.fail("sha256", "is not a SHA-256 in hex")
        return cls(path, sha, size)


@dataclass(frozen=True)
class SavedRunner:
    """A runner on disk: how to rebuild its backend, its description, its files."""

    backend: BackendRecord
    description: dict[str, Any]
    files: list[FileRecord] = field(default_factory=list)


def save_runner(runner: Runner, directory: Path, *, for_checkpoint: bool = False) -> SavedRunner:
    """Save ``runner`` into ``directory`` (existing, empty), hashing every file it wrote.

    Its description is checked to be JSON. Raises
    :class:`~tunetree.errors.BackendError` when the runner cannot be saved or writes anything but
    regular files.
    """
    try:
        description = runner.save(directory)
        description = json.loads(json.dumps(description))
    except Exception as exc:
        raise BackendError(
            f"could not save the {runner.backend.name} runner: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(description, dict):
        raise BackendError(f"the {runner.backend.name} runner's save() returned no JSON object")
    files = []
    for relative in files_under(directory):
        sha, size = file_sha256(directory / relative)
        files.append(FileRecord(relative, sha, size))
    record = BackendRecord.of(runner.backend, for_checkpoint=for_checkpoint)
    return SavedRunner(record, description, files)


def load_runner(
    record: SavedRunner,
    module: nn.Module,
    key: GraphKey,
    directory: Path,
    device: torch.device,
    backend: Backend | None = None,
    *,
    max_elements: int,
) -> Runner:
    """Rebuild a saved runner from its files in ``directory`` for ``module``'s graph ``key``.

    ``backend`` (default: built from the record) is the object the runner will report. The
    record is checked first (:meth:`~tunetree.backends.base.Backend.check_saved_runner`,
    ``max_elements`` from :func:`allowed_elements`). Errors of the backend's loader propagate
    unchanged; callers name the context. The runner's ``served`` says where it serves less
    than ``key``.
    """
    if backend is None:
        backend = record.backend.backend()
    backend.check_saved_runner(key, record.description, max_elements)
    return backend.load(module, key, directory, dict(record.description), device)


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s parameters and buffers (what a load of it reads at least)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def files_under(root: Path) -> list[str]:
    """Paths (``/``-separated, relative to ``root``, sorted) of every regular file below ``root``.

    Refuses links and other special files, which no store carries.
    """
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for filename in sorted(filenames):
            full = Path(dirpath) / filename
            if not stat.S_ISREG(full.lstat().st_mode):
                raise BackendError(f"{full} is not a regular file; only files can be stored")
            names.append(full.relative_to(root).as_posix())
    return names


def file_sha256(path: Path) -> tuple[str, int]:
    """SHA-256 (hex) and size of a file, read in blocks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


def remove_tree(path: Path) -> None:
    """Delete a file or directory tree, read-only files (cache artifacts) included.

    Where a removal fails on modes, the directories involved are made writable and it is tried
    again; only real directories are chmodded: a symbolic link is removed, never followed (a
    chmod would change the file it names, wherever that is).
    """

    def writable(func: Callable[..., Any], p: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            for directory in (os.path.dirname(p), p):
                if stat.S_ISDIR(os.lstat(directory).st_mode):
                    os.chmod(directory, stat.S_IRWXU)
            func(p)

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=writable)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_with(owner: Any, directory: Path) -> None:
    """Delete ``directory`` when ``owner`` is garbage-collected.

    A runner may read its files lazily, so they must live as long as it does. For an object that
    takes no weak references, the directory is deleted at exit.
    """
    try:
        weakref.finalize(owner, remove_tree, directory)
    except TypeError:
        atexit.register(remove_tree, directory)
