"""``tunetree info``: what a checkpoint holds, read without loading any weights."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import IncompatibleCheckpointError
from .compat import check_plan, read_bytes, tuned_device
from .environment import Difference, compare_records, environment_record
from .format import EnvironmentMismatchError, Manifest
from .reader import open_source, read_header, read_manifest


@dataclass
class CheckpointInfo:
    """What a checkpoint holds, read without loading any weights (see ``tunetree info``)."""

    path: Path
    version: int
    record: dict[str, Any]
    differences: list[Difference]
    manifest: Manifest
    refusal: str | None = None
    """Why ``tt.load`` refuses the plan here though the record matches (a backend this
    environment lacks or does not know), or None."""

    @property
    def compatible(self) -> bool:
        """True when this environment matches the record and passes the plan's checks.

        Those are every check ``tt.load`` makes before reading members
        (:func:`.compat.check_plan`).
        """
        return not self.differences and self.refusal is None

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
            "members_verified": False,
            "differences": [d.to_json() for d in self.differences],
            "depth": self.manifest.depth,
            "device": self.manifest.device,
            "model_type": self.manifest.model_type,
            "created_utc": self.manifest.created_utc,
            "plan": self.plan_rows(),
            "accuracy": self.manifest.accuracy,
        }


def read_info(path: str | os.PathLike[str], *, ignore: Iterable[str] = ()) -> CheckpointInfo:
    """Version, environment record, comparison with this environment, and manifest of a checkpoint.

    Reads the header and the manifest only (no weights, no artifacts) and runs the checks
    :func:`load` makes of the plan (:func:`.compat.check_plan`); raises like :func:`load` for
    another format version, a damaged file or a runner record that does not fit its graph
    (:class:`~tunetree.errors.BackendError`), but not for another environment (see
    :attr:`CheckpointInfo.differences` and :attr:`CheckpointInfo.refusal`).
    """
    path = Path(os.fspath(path))
    ignore = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    header = read_header(path)
    running = environment_record(header.record["backends"])
    differences = compare_records(header.record, running, ignore)
    refusal = None
    with open_source(path, header) as source:
        manifest = read_manifest(source, header)
        try:
            size = read_bytes(path, source, manifest)
            check_plan(path, header.record, manifest, tuned_device(manifest), size)
        except EnvironmentMismatchError:
            raise
        except IncompatibleCheckpointError as exc:
            refusal = str(exc)
    return CheckpointInfo(path, header.version, header.record, differences, manifest, refusal)
