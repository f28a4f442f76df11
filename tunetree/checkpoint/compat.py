"""What ``tt.load`` checks of a plan before it touches the model or any member.

``tunetree info`` runs the very same checks (:func:`check_plan`), so it never says a
checkpoint loads where ``tt.load`` refuses it for its record, its backends or its runner
records. What only a load can see (members' checksums and contents, the model's weights)
is left to the load; ``info`` says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..artifacts import allowed_elements
from ..backends.base import Backend
from ..errors import (
    BackendError,
    BackendUnavailableError,
    CheckpointError,
    IncompatibleCheckpointError,
    UntrustedConfigError,
)
from .environment import unrecorded_libraries
from .format import EntryRecord, Manifest
from .reader import Source


def needed_entries(manifest: Manifest) -> list[int]:
    """Entries to rebuild: those of paths that are wrapped.

    A path is wrapped where some graph's winner is not eager (as :meth:`Plan.runners` decides). The
    others need nothing from the file.
    """
    wrapped = {e.path for e in manifest.entries if e.backend.kind != "eager"}
    return [n for n, e in enumerate(manifest.entries) if e.path in wrapped]


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
    (:func:`~tunetree.artifacts.allowed_elements`). Returns the backend of each needed entry
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
            backend.check_saved_runner(entry.graph, entry.runner, max_elements)
        except Exception as exc:  # a backend's own check: any failure refuses the record
            raise BackendError(
                f"the saved {backend.name} runner of {where(entry)} does not fit its graph: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        backends[n] = backend
    return backends
