"""The ``.tt`` format: header, limits, member names, and the typed manifest.

Layout of a ``.tt`` file::

    uint32 little-endian   format version (FORMAT_VERSION)
    uint32 little-endian   length in bytes of the environment record
    bytes                  environment record: UTF-8 JSON (see tunetree.checkpoint.environment)
    zip archive            manifest.json, weights.safetensors, runners/<n>/<artifact files>

``save(..., compress_checkpoint=False)`` writes a directory instead: ``tunetree-format``
(the version as text), ``environment.json`` (the record) and the archive's members as
files. The manifest (:class:`Manifest`) lists every member with its SHA-256 and size, and
one :class:`EntryRecord` per plan entry.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any

from .._util.records import Fields
from ..errors import CheckpointError, IncompatibleCheckpointError
from ..runtime.artifacts import BackendRecord
from ..signature.graph import Dim, GraphKey, TensorSpec
from .environment import Difference
from .whole import WholeRecord

FORMAT_VERSION = 1
"""The ``.tt`` format version this tunetree writes and reads."""

LEGACY_ZIP_VERSION = int.from_bytes(b"PK\x03\x04", "little")
"""What a bare zip archive (written before the versioned header existed) reads as: 67324752."""

MAX_RECORD_BYTES = 1 << 20
"""Largest environment record accepted (a real one is a few KiB)."""
MAX_MANIFEST_BYTES = 64 << 20
"""Largest manifest accepted."""
MAX_MEMBER_BYTES = 64 << 30
"""Largest single member extracted (uncompressed)."""
MAX_TOTAL_BYTES = 256 << 30
"""Largest total extracted by one load (uncompressed)."""
MAX_MEMBERS = 100_000
"""Most members an archive (and its manifest's member table) may hold."""
MAX_ENTRIES = 100_000
"""Most plan entries a manifest may hold."""
MAX_GRAPH_ELEMENTS = 1 << 28
"""Most elements the tensors of one saved graph key may hold together (1 GiB of float32):
loading may allocate zeros of that shape, so a larger key is refused before anything is
allocated."""
DEVICE = re.compile(r"[a-z][a-z0-9_]{0,15}(:[0-9]{1,4})?")
"""What a manifest's device may look like (``cpu``, ``cuda:1``)."""
MAX_COMPRESSION_RATIO = 200
"""Members above 1 MiB may not expand more than this over their compressed size (deflate
reaches about 1000 only on degenerate input such as a zip bomb's zeros)."""

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
RUNNERS = "runners"
DIR_FORMAT = "tunetree-format"
DIR_ENVIRONMENT = "environment.json"

HEADER = struct.Struct("<II")
"""Format version and environment record length, before the record."""

CHUNK = 1 << 20
"""Bytes read or written at a time."""


class EnvironmentMismatchError(IncompatibleCheckpointError):
    """The checkpoint was tuned in another environment; ``differences`` lists every entry."""

    def __init__(self, message: str, differences: list[Difference]) -> None:
        super().__init__(message)
        self.differences = differences


class ManifestError(CheckpointError):
    """The checkpoint's manifest is malformed; the message names the field."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the checkpoint's manifest is malformed ({what}); the file is damaged")


def check_member_name(name: str) -> None:
    """Refuse names that could land outside the extraction directory (zip-slip)."""
    parts = name.split("/")
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or name.startswith("/")
        or ":" in parts[0]
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise CheckpointError(
            f"the archive holds a member named {name!r}, which would be written outside its "
            "directory (absolute path, '..', backslash or drive letter): the file is hostile "
            "or damaged; nothing was extracted"
        )


def check_no_file_dir_clash(names: Any) -> None:
    """Refuse a member that is also the directory of another (``a`` and ``a/b``)."""
    directories = {name.rsplit("/", 1)[0] for name in names if "/" in name}
    parents = {"/".join(d.split("/")[:i]) for d in directories for i in range(1, d.count("/") + 2)}
    clash = sorted(parents & set(names))
    if clash:
        raise CheckpointError(
            f"the archive holds {clash[0]!r} both as a file and as a directory: the file is "
            "hostile or damaged; nothing was extracted"
        )


def graph_elements(signature: Any) -> int:
    """Elements of every tensor of a graph signature together (ranges at their maximum)."""
    if isinstance(signature, GraphKey):
        parts = [*signature.args, *(v for _, v in signature.kwargs)]
        return sum(graph_elements(p) for p in parts)
    if isinstance(signature, TensorSpec):
        return math.prod(d.max if isinstance(d, Dim) else d for d in signature.shape)
    if isinstance(signature, tuple):
        return sum(graph_elements(p) for p in signature)
    return 0


@dataclass(frozen=True)
class MemberRecord:
    """A member's SHA-256 and size (uncompressed)."""

    sha256: str
    size: int

    def to_json(self) -> dict[str, Any]:
        """This record as JSON data."""
        return {"sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, fields: Fields) -> MemberRecord:
        """Read a record from a manifest's fields; raises on a malformed field."""
        size = fields.get("size", int)
        if size < 0:
            raise fields.fail("size", "is negative")
        return cls(fields.get("sha256", str), size)


@dataclass(frozen=True)
class EntryRecord:
    """One plan entry: a module path's graph, its winning backend and that runner's files."""

    path: str
    graph: GraphKey
    graph_text: str
    backend: BackendRecord
    runner: dict[str, Any]
    members: list[str]
    latency_s: float | None = None
    eager_latency_s: float | None = None
    tolerances: dict[str, Any] | None = None
    max_abs_diff: float | None = None

    def to_json(self) -> dict[str, Any]:
        """This record as JSON data."""
        return {
            "path": self.path,
            "graph": self.graph.to_json(),
            "graph_text": self.graph_text,
            "backend": self.backend.to_json(),
            "runner": self.runner,
            "members": self.members,
            "latency_s": self.latency_s,
            "eager_latency_s": self.eager_latency_s,
            "tolerances": self.tolerances,
            "max_abs_diff": self.max_abs_diff,
        }

    @classmethod
    def from_json(cls, fields: Fields) -> EntryRecord:
        """Read a record from a manifest's fields; raises on a malformed field."""
        try:
            graph = GraphKey.from_json(fields.data.get("graph"))
        except (ValueError, TypeError, RecursionError) as exc:
            raise fields.fail("graph", f"is not a graph key ({exc})") from exc
        if graph_elements(graph) > MAX_GRAPH_ELEMENTS:
            raise fields.fail(
                "graph",
                f"has tensors of over {MAX_GRAPH_ELEMENTS} elements together "
                "(tunetree.checkpoint.format.MAX_GRAPH_ELEMENTS); refused before allocating",
            )
        members = fields.get("members", list)
        if not all(isinstance(m, str) for m in members):
            raise fields.fail("members", "holds something other than member names")
        return cls(
            fields.get("path", str),
            graph,
            fields.get("graph_text", str, ""),
            BackendRecord.from_json(
                fields.get("backend", dict), fields.name("backend"), fields.error
            ),
            fields.get("runner", dict),
            members,
            fields.optional("latency_s", float),
            fields.optional("eager_latency_s", float),
            fields.optional("tolerances", dict),
            fields.optional("max_abs_diff", float),
        )


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: what the archive holds, validated as a whole on read."""

    environment_sha256: str
    members: dict[str, MemberRecord]
    weights_member: str
    entries: list[EntryRecord]
    format_version: int = FORMAT_VERSION
    tunetree_version: str = ""
    created_utc: str = ""
    model_type: str = ""
    device: str = "cpu"
    depth: int | None = None
    weights_tensors: int = 0
    accuracy: dict[str, Any] | None = None
    """Set when the plan was tuned under an accuracy budget: the budget and measured error."""
    whole: WholeRecord | None = None
    """Set when one runner serves the whole model (no plan entries): what rebuilds it."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        """This manifest as JSON data."""
        return {
            "format_version": self.format_version,
            "tunetree_version": self.tunetree_version,
            "created_utc": self.created_utc,
            "environment_sha256": self.environment_sha256,
            "model_type": self.model_type,
            "device": self.device,
            "depth": self.depth,
            "weights": {
                "member": self.weights_member,
                "format": "safetensors",
                "tensors": self.weights_tensors,
            },
            "entries": [e.to_json() for e in self.entries],
            "members": {name: m.to_json() for name, m in self.members.items()},
            **({"accuracy": self.accuracy} if self.accuracy is not None else {}),
            **({"whole": self.whole.to_json()} if self.whole is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        """Validate a parsed ``manifest.json``.

        Raises :class:`ManifestError` naming the first malformed field (or :class:`CheckpointError`
        for unsafe member names and weights stored other than as safetensors).
        """
        fields = Fields(data, "", ManifestError)
        members = {}
        table = fields.get("members", dict)
        if len(table) > MAX_MEMBERS or len(fields.get("entries", list)) > MAX_ENTRIES:
            raise ManifestError(f"over {MAX_MEMBERS} members or {MAX_ENTRIES} entries")
        check_no_file_dir_clash(table)
        for name, meta in table.items():
            check_member_name(name)
            members[name] = MemberRecord.from_json(
                Fields(meta, f"members[{name!r}]", ManifestError)
            )
        weights = fields.child("weights")
        if weights.get("format", str) != "safetensors":
            raise CheckpointError(
                f"weights stored as {weights.data['format']!r}; this tunetree reads safetensors "
                "only (it never unpickles weights)"
            )
        weights_member = weights.get("member", str)
        if weights_member not in members:
            raise weights.fail("member", "is not in the member table")
        entries = fields.items("entries", EntryRecord.from_json)
        for i, entry in enumerate(entries):
            unknown = [m for m in entry.members if m not in members]
            if unknown:
                raise ManifestError(
                    f"field 'entries[{i}].members' names {unknown[0]!r}, not in the member table"
                )
            if any(not m.startswith(f"{RUNNERS}/{i}/") for m in entry.members):
                raise ManifestError(f"field 'entries[{i}].members' names another entry's files")
        whole = None
        if fields.data.get("whole") is not None:
            whole = WholeRecord.from_json(fields.child("whole"))
            if entries:
                raise fields.fail("whole", "is set beside plan entries (one or the other)")
        device = fields.get("device", str, "cpu")
        if not DEVICE.fullmatch(device):
            raise fields.fail("device", f"is {device[:40]!r}, not a device such as 'cuda:0'")
        return cls(
            fields.get("environment_sha256", str),
            members,
            weights_member,
            entries,
            fields.get("format_version", int, FORMAT_VERSION),
            fields.get("tunetree_version", str, ""),
            fields.get("created_utc", str, ""),
            fields.get("model_type", str, ""),
            device,
            fields.optional("depth", int),
            weights.get("tensors", int, 0),
            read_accuracy(fields),
            whole,
        )


def read_accuracy(fields: Fields) -> dict[str, Any] | None:
    """The manifest's accuracy record, every field checked (None when tuned without a budget)."""
    if fields.data.get("accuracy") is None:
        return None
    record = fields.child("accuracy")
    budget = record.child("budget")
    names = {"metric": str, "evaluate": str}
    numbers = ("max_error", "max_drop", "module_max_error", "holdout")
    checked_budget = {n: budget.optional(n, kind) for n, kind in names.items()}
    checked_budget.update({n: budget.optional(n, float) for n in numbers})
    for name in ("metric", "evaluate"):
        value = checked_budget[name]
        if value is not None and len(value) > 200:
            raise budget.fail(name, "is longer than 200 characters")
    return {
        "budget": checked_budget,
        **{n: record.optional(n, float) for n in ("error", "heldout_error", "score_drop")},
        "changes_results": record.get("changes_results", bool, True),
    }


def accuracy_note(record: dict[str, Any], changes_results: bool | None = None) -> str:
    """One line: the checkpoint's plan was tuned under an accuracy budget, with its error.

    ``changes_results``: whether the plan's content changes results (a load knows it from the
    runners' backends); the record's own claim is used only without it.
    """
    budget = record.get("budget", {})
    bound = []
    if budget.get("max_error") is not None:
        bound.append(f"{budget.get('metric')} <= {budget['max_error']:g}")
    if budget.get("max_drop") is not None:
        bound.append(f"{budget.get('evaluate')} drop <= {budget['max_drop']:g}")
    measured = [
        f"{label} {record[name]:.3g}"
        for name, label in (
            ("error", "error"),
            ("heldout_error", "held-out error"),
            ("score_drop", "score drop"),
        )
        if record.get(name) is not None
    ]
    differ = record.get("changes_results") if changes_results is None else changes_results
    changes = "its outputs differ from eager's" if differ else "results kept"
    return (
        f"tuned under an accuracy budget ({', '.join(bound) or 'unstated'}): {changes}; measured "
        f"{', '.join(measured) or 'nothing'}"
    )
