"""``tunetree info``: what a checkpoint holds and whether it loads here, without the model."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.base import Backend
from ..errors import IncompatibleCheckpointError
from ..signature.graph import GraphKey
from .compat import (
    check_plan,
    extract_runners,
    needed_entries,
    read_bytes,
    rebuilding,
    runner_directory,
    tuned_device,
)
from .environment import Difference, compare_records, environment_record, with_libraries
from .format import EnvironmentMismatchError, Manifest
from .reader import Budget, Source, open_source, read_header, read_manifest, verify
from .staging import recover
from .weights_header import read_header as read_weights_header
from .whole import check_libraries, recorded_libraries


@dataclass(frozen=True)
class MembersCheck:
    """What ``tunetree info`` read of a checkpoint's members and checked, as ``tt.load`` does."""

    members: int
    """Members verified against their size and SHA-256: the weights and the needed runners'."""
    runners: int
    """Runners whose artifacts were read by their backend and checked against their records."""
    narrowed: dict[int, str] = field(default_factory=dict)
    """Entries whose artifact serves less than their graph: entry index -> the graph it serves
    (``tt.load`` wraps the runner under it; other calls run the original forward)."""

    def to_json(self) -> dict[str, Any]:
        """This check as JSON data (``verified`` in ``tunetree info --json``)."""
        return {
            "members": self.members,
            "runners": self.runners,
            "narrowed": [{"entry": n, "serves": g} for n, g in sorted(self.narrowed.items())],
        }


@dataclass
class CheckpointInfo:
    """What a checkpoint holds, read without the model (see ``tunetree info``)."""

    path: Path
    version: int
    record: dict[str, Any]
    differences: list[Difference]
    manifest: Manifest
    refusal: str | None = None
    """Why ``tt.load`` refuses the checkpoint here though the record matches (a backend this
    environment lacks or does not know, a package its artifacts need), or None."""
    verified: MembersCheck | None = None
    """What was read of the members and checked; None when they were not read (the
    environment differs, or ``refusal`` came first)."""

    @property
    def compatible(self) -> bool:
        """True when this environment matches the record and the file passes load's checks.

        Those are every check ``tt.load`` makes without the model: the plan's
        (:func:`.compat.check_plan`) and the members' (:func:`check_members`).
        """
        return not self.differences and self.refusal is None and self.verified is not None

    def plan_rows(self) -> list[dict[str, Any]]:
        """One row per plan entry: module path, graph, backend, latencies."""
        return [
            {
                "path": e.path,
                "graph": e.graph_text,
                "backend": e.backend.name or e.backend.kind,
                "latency_s": e.latency_s,
                "eager_latency_s": e.eager_latency_s,
                "members": len(e.members),
            }
            for e in self.manifest.entries
        ]

    def to_json(self) -> dict[str, Any]:
        """Everything ``tunetree info --json`` prints."""
        return {
            "path": str(self.path),
            "format_version": self.version,
            "environment": self.record,
            "compatible": self.compatible,
            "refusal": self.refusal,
            "members_verified": self.verified is not None,
            "verified": self.verified.to_json() if self.verified is not None else None,
            "differences": [d.to_json() for d in self.differences],
            "depth": self.manifest.depth,
            "device": self.manifest.device,
            "model_type": self.manifest.model_type,
            "created_utc": self.manifest.created_utc,
            "plan": self.plan_rows(),
            "accuracy": self.manifest.accuracy,
            "whole": self.manifest.whole.to_json() if self.manifest.whole is not None else None,
        }


def read_info(path: str | os.PathLike[str], *, ignore: Iterable[str] = ()) -> CheckpointInfo:
    """Version, environment record, comparison with this environment, and manifest of a checkpoint.

    Runs every check :func:`load` makes without the model: of the plan
    (:func:`.compat.check_plan`) and, where the environment matches and the plan passes, of
    the members (:func:`check_members`). Raises like :func:`load` for another format
    version, a damaged or altered file or a runner that does not fit its graph or artifacts
    (:class:`~tunetree.errors.BackendError`), but not for another environment (see
    :attr:`CheckpointInfo.differences` and :attr:`CheckpointInfo.refusal`).
    """
    path = Path(os.fspath(path))
    ignore = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    recover(path)  # as tt.load does
    header = read_header(path)
    running = with_libraries(
        environment_record(header.record["backends"]), recorded_libraries(header.record)
    )
    differences = compare_records(header.record, running, ignore)
    refusal, verified = None, None
    with open_source(path, header) as source:
        manifest = read_manifest(source, header)
        try:
            size = read_bytes(path, source, manifest)
            backends = check_plan(path, header.record, manifest, tuned_device(manifest), size)
            if manifest.whole is not None:
                check_libraries(path, header.record, manifest.whole)
            if not differences:
                verified = check_members(source, manifest, backends)
        except EnvironmentMismatchError:
            raise
        except IncompatibleCheckpointError as exc:
            refusal = str(exc)
    return CheckpointInfo(
        path, header.version, header.record, differences, manifest, refusal, verified
    )


def check_members(source: Source, manifest: Manifest, backends: dict[int, Backend]) -> MembersCheck:
    """Read the members ``tt.load`` reads and check them as it does, without the model.

    The weights and every needed entry's members are read within one byte budget and
    verified against their SHA-256 (the runners' into a private directory, removed after),
    the weights' safetensors header is checked as the load checks it
    (:func:`.weights_header.read_header`), then each runner's artifacts are read by its
    backend and checked against its records
    (:meth:`~tunetree.backends.base.Backend.check_saved_artifacts`, which its ``load`` runs).
    ``backends`` are :func:`.compat.check_plan`'s. Raises what ``tt.load`` raises.
    """
    workdir = Path(tempfile.mkdtemp(prefix="tunetree-info-"))
    try:
        budget = Budget()
        verify(source, manifest.weights_member, manifest, budget)
        with source.open(manifest.weights_member) as weights:
            read_weights_header(weights, manifest.members[manifest.weights_member].size)
        extract_runners(source, manifest, workdir, budget)
        served = {n: _served(manifest, n, b, workdir) for n, b in backends.items()}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    needed = needed_entries(manifest)
    checked = {n: key for n, key in served.items() if key is not None}
    return MembersCheck(
        members=1 + sum(len(manifest.entries[n].members) for n in needed),
        runners=len(checked),
        narrowed={n: str(key) for n, key in checked.items() if key != manifest.entries[n].graph},
    )


def _served(manifest: Manifest, n: int, backend: Backend, workdir: Path) -> GraphKey | None:
    """What entry ``n``'s artifacts serve (None: it has none to read), failures as load's."""
    entry = manifest.entries[n]
    with rebuilding(backend, entry):
        return backend.check_saved_artifacts(
            entry.graph, runner_directory(workdir, n), entry.runner
        )
