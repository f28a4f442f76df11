"""Typed records of a tuning-cache entry: its manifest, candidates and saved artifacts.

:meth:`EntryManifest.from_json` validates a whole manifest in one place: a missing or
mistyped field raises :class:`MalformedEntryError` naming it, and the entry is then
treated like any other fault (marked invalid, the graph tuned again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._util.records import Fields
from ..candidates.budget import TIME_BUDGET_ERROR
from ..candidates.evaluate import Status
from ..candidates.measure import Timing
from ..errors import CacheError
from ..runtime.artifacts import BackendRecord, FileRecord


class EntryFault(CacheError):
    """An entry cannot be used: missing or corrupt files, another schema or environment."""


class EntryMissing(EntryFault):
    """No entry under this key (a plain miss)."""


class MalformedEntryError(EntryFault):
    """An entry's manifest is not shaped as this release writes it; names the field."""


_TIMING_FIELDS = ("median_s", "q1_s", "q3_s", "min_s", "trials", "calls_per_trial")


@dataclass(frozen=True)
class ArtifactRecord:
    """A candidate's saved runner: its description and files, or why it was not saved."""

    description: dict[str, Any] | None = None
    files: list[FileRecord] = field(default_factory=list)
    error: str | None = None

    @property
    def saved(self) -> bool:
        """True when the candidate's runner was saved (no error, a description)."""
        return self.error is None and self.description is not None

    def to_json(self) -> dict[str, Any]:
        """This record as JSON data: the error, or the description and files."""
        if self.error is not None:
            return {"error": self.error}
        return {"description": self.description, "files": [f.to_json() for f in self.files]}

    @classmethod
    def from_json(cls, fields: Fields) -> ArtifactRecord:
        """Read a record from a manifest's fields; raises on a malformed field."""
        if "error" in fields.data:
            return cls(error=fields.get("error", str))
        return cls(
            fields.optional("description", dict) or {},
            fields.items("files", lambda f: FileRecord.from_json(f.data, f.where, f.error)),
        )


@dataclass
class CandidateRecord:
    """One candidate's recorded row (status, reason, timing) and its artifact."""

    backend: BackendRecord
    name: str
    candidate_key: str
    status: Status
    reason: str = ""
    build_s: float | None = None
    max_abs_diff: float | None = None
    timing: Timing | None = None
    batch: int = 1
    max_batch_size: int | None = None
    artifact: ArtifactRecord | None = None

    @property
    def files(self) -> list[FileRecord]:
        """The candidate's saved files (none when it has no artifact)."""
        return self.artifact.files if self.artifact is not None else []

    def to_json(self) -> dict[str, Any]:
        """This record as JSON data."""
        t = self.timing
        return {
            "backend": self.backend.to_json(),
            "name": self.name,
            "candidate_key": self.candidate_key,
            "status": self.status.value,
            "reason": self.reason,
            "build_s": self.build_s,
            "max_abs_diff": self.max_abs_diff,
            "timing": None if t is None else {f: getattr(t, f) for f in _TIMING_FIELDS},
            "batch": self.batch,
            "max_batch_size": self.max_batch_size,
            "artifact": None if self.artifact is None else self.artifact.to_json(),
        }

    @classmethod
    def from_json(cls, fields: Fields) -> CandidateRecord:
        """Read a record from a manifest's fields; raises on a malformed field."""
        status = fields.get("status", str)
        try:
            parsed = Status(status)
        except ValueError:
            raise fields.fail("status", f"is {status!r}, not a candidate status") from None
        timing = None
        if fields.data.get("timing") is not None:
            t = fields.child("timing")
            timing = Timing(
                *(t.get(f, float) for f in _TIMING_FIELDS[:4]),
                *(t.get(f, int) for f in _TIMING_FIELDS[4:]),
            )
        artifact = None
        if fields.data.get("artifact") is not None:
            artifact = ArtifactRecord.from_json(fields.child("artifact"))
        return cls(
            BackendRecord.from_json(
                fields.get("backend", dict), fields.name("backend"), fields.error
            ),
            fields.get("name", str, ""),
            fields.get("candidate_key", str, ""),
            parsed,
            fields.get("reason", str, ""),
            fields.optional("build_s", float),
            fields.optional("max_abs_diff", float),
            timing,
            fields.get("batch", int, 1),
            fields.optional("max_batch_size", int),
            artifact,
        )


@dataclass
class EntryManifest:
    """``entries/<key>/manifest.json``: one graph's tuning, keyed and reusable."""

    schema: int
    key: str
    entry_id: str
    created: float
    path: str
    graph_text: str
    graph: str
    module: dict[str, Any]
    strategy: dict[str, Any]
    strategy_text: str
    tolerances: Any
    hard: dict[str, Any]
    soft: dict[str, Any]
    candidates: list[CandidateRecord]
    winner: int | None
    edges: dict[str, Any] = field(default_factory=dict)
    family: str = ""
    """See :attr:`tunetree.cache.keys.EntryIdentity.family` (empty in older entries)."""
    graph_key: dict[str, Any] | None = None
    """The graph's key as :meth:`GraphKey.to_json` data (None in older entries): which sizes
    the entry serves."""

    @property
    def partial(self) -> bool:
        """The time budget skipped some of its candidates: the race it records was cut short.

        Such an entry serves only a recorded plan that chose one of its candidates
        (:meth:`tunetree.cache.TuningCache.lookup_recorded`); a lookup that races the graph
        takes it for a miss and replaces it with the whole race.
        """
        return any(c.reason == TIME_BUDGET_ERROR for c in self.candidates)

    def referenced(self) -> list[FileRecord]:
        """Every artifact file the entry references (its dependency edges to artifacts)."""
        return [f for c in self.candidates for f in c.files]

    def to_json(self) -> dict[str, Any]:
        """This manifest as JSON data."""
        return {
            "schema": self.schema,
            "key": self.key,
            "entry_id": self.entry_id,
            "created": self.created,
            "path": self.path,
            "graph_text": self.graph_text,
            "graph": self.graph,
            "module": self.module,
            "strategy": self.strategy,
            "strategy_text": self.strategy_text,
            "tolerances": self.tolerances,
            "environment": {"hard": self.hard, "soft": self.soft},
            "edges": self.edges,
            "candidates": [c.to_json() for c in self.candidates],
            "winner": self.winner,
            "family": self.family,
            "graph_key": self.graph_key,
        }

    @classmethod
    def from_json(cls, data: Any, key: str = "") -> EntryManifest:
        """Validate a parsed manifest; raises :class:`MalformedEntryError` naming the field."""
        fields = Fields(data, f"entry {key[:12]}" if key else "", MalformedEntryError)
        env = fields.child("environment")
        candidates = fields.items("candidates", CandidateRecord.from_json)
        winner = fields.optional("winner", int)
        if winner is not None and not 0 <= winner < len(candidates):
            raise fields.fail("winner", f"is {winner}, not one of the {len(candidates)} candidates")
        return cls(
            fields.get("schema", int),
            fields.get("key", str),
            fields.get("entry_id", str),
            fields.get("created", float, 0.0),
            fields.get("path", str),
            fields.get("graph_text", str, ""),
            fields.get("graph", str, ""),
            fields.get("module", dict),
            fields.get("strategy", dict),
            fields.get("strategy_text", str, ""),
            fields.data.get("tolerances"),
            env.get("hard", dict),
            env.get("soft", dict),
            candidates,
            winner,
            fields.get("edges", dict, {}),
            fields.get("family", str, ""),
            fields.optional("graph_key", dict),
        )
