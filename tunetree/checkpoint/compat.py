"""What ``tt.load`` checks of a checkpoint without the model, shared with ``tunetree info``.

The plan (:func:`check_plan`: record, backends, runner records), then the members: each
read within one byte budget and verified against its SHA-256 (:func:`extract_runners`), and
each runner's artifacts read by its backend and checked against its records
(:meth:`~tunetree.backends.base.Backend.check_saved_artifacts`, which the backend's ``load``
runs too), every failure named the same way (:func:`rebuilding`). So ``info`` never says a
checkpoint loads where ``tt.load`` refuses it without the model; what only the model can
show (its weights' shapes, a named output container) is left to the load, and ``info``
says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..backends.base import Backend
from ..errors import (
    BackendError,
    BackendUnavailableError,
    CheckpointError,
    IncompatibleCheckpointError,
    UntrustedConfigError,
)
from ..runtime.artifacts import allowed_elements
from ..signature.synthetic import check_key_names
from .environment import unrecorded_libraries
from .format import RUNNERS, EntryRecord, Manifest
from .reader import Budget, Source, extract


def needed_entries(manifest: Manifest) -> list[int]:
    """Entries to rebuild: those of paths that are wrapped.

    A path is wrapped where some graph's winner is not eager (as :meth:`Plan.runners` decides). The
    others need nothing from the file, nor do entries keyed by an object's identity.
    """
    wrapped = {e.path for e in manifest.entries if e.backend.kind != "eager"}
    return [
        n
        for n, e in enumerate(manifest.entries)
        if e.path in wrapped and not e.graph.has_opaque  # keyed by an object's identity: no
    ]  # call after a load can match it, so it is neither read nor rebuilt


def tuned_device(manifest: Manifest) -> torch.device:
    """The device the plan was tuned on; CheckpointError when it is no torch device."""
    try:
        return torch.device(manifest.device)
    except RuntimeError as exc:
        raise CheckpointError(
            f"the manifest's device {manifest.device!r} is not a torch device"
        ) from exc


def read_bytes(path: Path, source: Source, manifest: Manifest) -> int:
    """How many bytes the checkpoint holds: the file's size, or a directory's members'."""
    if not path.is_dir():
        return path.stat().st_size
    total = 0
    for name in manifest.members:
        try:
            total += source.size(name)
        except (CheckpointError, OSError):
            continue  # a missing member is refused when it is extracted
    return total


def check_recorded_libraries(path: Path, record: dict[str, Any], manifest: Manifest) -> None:
    """Every backend the plan rebuilds, and each of its libraries, must be in the record."""
    kinds = [manifest.entries[n].backend.kind for n in needed_entries(manifest)]
    missing = unrecorded_libraries(record, kinds)
    if missing:
        raise CheckpointError(
            f"{path}: the environment record does not list what the plan needs "
            f"({'; '.join(missing[:8])}), so the environment cannot be compared: the file "
            "is damaged or was altered"
        )


def where(entry: EntryRecord) -> str:
    """An entry's module path and graph, to name it in messages."""
    return f"{entry.path or '<model>'} {entry.graph}"


def entry_backend(entry: EntryRecord, device: torch.device, trust_config: bool) -> Backend:
    """The backend that rebuilds ``entry`` on ``device``, each refusal typed and named."""
    kind = entry.backend.kind
    try:
        backend = entry.backend.backend(trust_config=trust_config)
    except UntrustedConfigError as exc:
        raise UntrustedConfigError(f"{where(entry)}: {exc}") from exc
    except BackendUnavailableError as exc:
        raise IncompatibleCheckpointError(
            f"{where(entry)} uses backend {kind!r}, which this tunetree does not know; load "
            "with the tunetree release that saved it, or tune again"
        ) from exc
    except Exception as exc:
        raise CheckpointError(
            f"{where(entry)}: the saved {kind} configuration is not valid here ({exc})"
        ) from exc
    reason = backend.unavailable_reason(device)
    if reason is not None:
        raise IncompatibleCheckpointError(
            f"{where(entry)} uses {backend.name}, unavailable here: {reason}"
        )
    return backend


def check_plan(
    path: Path,
    record: dict[str, Any],
    manifest: Manifest,
    device: torch.device,
    size: int,
    trust_config: bool = False,
) -> dict[int, Backend]:
    """Every check of the plan that needs neither the model nor a member; the backends.

    The record must list what the plan needs; each needed entry's backend must be known,
    allowed (``trust_config``) and available on ``device``; its runner record must fit its
    graph and ask for no more memory than a checkpoint of ``size`` bytes accounts for
    (:func:`~tunetree.runtime.artifacts.allowed_elements`). Returns the backend of each needed entry
    by index. Raises :class:`CheckpointError` (:class:`IncompatibleCheckpointError` where
    the file is sound but cannot load here) or :class:`BackendError` for a runner record.
    """
    check_recorded_libraries(path, record, manifest)
    max_elements = allowed_elements(size)
    backends = {}
    for n in needed_entries(manifest):
        entry = manifest.entries[n]
        backend = entry_backend(entry, device, trust_config)
        try:
            check_key_names(entry.graph)  # cache classes of the key: the allow-list only
            backend.check_saved_runner(entry.graph, entry.runner, max_elements)
        except Exception as exc:  # a backend's own check: any failure refuses the record
            raise BackendError(
                f"the saved {backend.name} runner of {where(entry)} does not fit its graph: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        backends[n] = backend
    return backends


def extract_runners(source: Source, manifest: Manifest, workdir: Path, budget: Budget) -> None:
    """Extract the needed entries' members into ``workdir``, each verified (:func:`.extract`).

    Entry ``n``'s files land in :func:`runner_directory` of ``n``.
    """
    for n in needed_entries(manifest):
        for name in manifest.entries[n].members:
            extract(source, name, manifest, workdir, budget)


def runner_directory(workdir: Path, n: int) -> Path:
    """Where entry ``n``'s members are extracted under ``workdir`` (made when missing)."""
    directory = workdir.joinpath(RUNNERS, str(n))
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@contextlib.contextmanager
def rebuilding(backend: Backend, entry: EntryRecord) -> Iterator[None]:
    """Name any failure of reading or rebuilding ``entry``'s saved runner, typed.

    A missing package is an :class:`IncompatibleCheckpointError` (the file may be sound),
    anything else a :class:`BackendError`, each with the module path and graph.
    """
    try:
        yield
    except ImportError as exc:
        raise IncompatibleCheckpointError(
            f"reading the saved {backend.name} runner of {where(entry)} needs a package this "
            f"environment lacks ({type(exc).__name__}: {exc})"
        ) from exc
    except Exception as exc:
        raise BackendError(
            f"could not rebuild the saved {backend.name} runner of {where(entry)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
