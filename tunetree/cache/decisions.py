"""auto_tune's depth decisions, kept in the tuning cache beside its entries.

A decision is what :func:`tunetree.auto_tune` chose among the depths it measured (or that it
left the model untuned): per depth, the plan it kept (which graph of which module on which
backend) and the speed-up measured there, and the selected depth. A host of the same kind
that finds it can skip measuring every depth again (:mod:`tunetree.search.decision`).

**Key** (:func:`decision_identity`): everything the choice depends on. The structure digest
of each of the model's roots (:func:`~tunetree.cache.keys.structure_digest`: code, attributes,
parameter shapes, every child), the dataset's signatures (the depth-0 modules' graph keys,
ranges included), the ``call`` function, the strategy record, the tolerances, the accuracy
budget (or none), the depths tried, the tie tolerance, the measurement configuration, the
hard environment fields (as entries: library versions, device, CPU model and flags), and the
number of threads torch runs with. An entry re-measures its candidates when the threads
differ (a soft field); a decision is keyed by them instead, since it ranks end-to-end timings
of whole depths that the thread count reorders and that only the full search measures: a
host with other threads runs the full search (its graphs from the cache, re-measured, not
rebuilt) and records its own decision beside the first, which hosts like it then reuse.

**Record**: small JSON, content-checked and bounded, in the sealed envelope of
:mod:`.sealing` under its own first line (``tunetree-depth-decision 1``): signed with
``$TUNETREE_CACHE_KEY`` when it is set, and then an unsigned or wrongly signed record is
refused, locally too (the local cache directory may be shared). Locally
``decisions/<key>``; on the remote tier ``v1/decisions/<key>``. Every byte read is hostile
until checked: at most :data:`MAX_DECISION_BYTES`, a regular file (no symbolic link), a
sha256 line over the body, bounded JSON, typed fields (:class:`MalformedDecisionError`
names the field), its key, schema and hard environment. A recorded backend is only
compared with the backend of a cache hit, never built, imported or unpickled.

**Read** (:meth:`DecisionStore.get`): the local record, else the remote's (written into the
local cache once checked). **Write** (:meth:`DecisionStore.put`): the local file by atomic
rename, then one put on the remote, replacing an older decision there (the newest full
search is the better evidence; S3 replaces an object whole). Neither ever raises: a refused
record is logged and the caller runs the full search.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util.fs import is_real_dir, read_regular, write_atomically
from .._util.json_io import loads_bounded
from .._util.records import Fields
from ..accuracy.budget import AccuracyBudget
from ..candidates.measure import MeasureConfig
from ..runtime.plan import Plan
from ..signature.inspection import ModelInfo
from ..signature.modules import CallFn, root_modules
from . import keys
from .entry import EntryFault
from .remote import LAYOUT, RemoteTier, get_object, is_key, put_object
from .sealing import seal, secret_from_env, unseal

log = logging.getLogger(__name__)

DECISION_SCHEMA = 2
"""Version of the decision record and of its key composition (2: strategies and backends
named as :data:`tunetree.cache.keys.SCHEMA` 2 names them; a record of 1 is a miss)."""
MAGIC = b"tunetree-depth-decision 1"
"""First line of a decision's envelope (an entry's is another: neither passes for the other)."""
DIRECTORY = "decisions"
MAX_DECISION_BYTES = 1 << 20
"""Largest decision read (a real one is a few KiB: about 300 bytes per planned graph)."""
MAX_DEPTHS = 64
MAX_PLAN_GRAPHS = 4096
MAX_TEXT = 200
"""Longest display text kept (a graph's description), in characters."""


class DecisionFault(EntryFault):
    """A depth decision cannot be used: unreadable, forged, of another key or schema."""


class MalformedDecisionError(DecisionFault):
    """A decision record is not shaped as this release writes it; names the field."""


def _digest_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and all(c in "0123456789abcdef" for c in text)


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class PlannedGraph:
    """One graph of a plan: module path, graph (sha256 of its key) and backend record."""

    path: str
    graph: str
    backend: dict[str, Any]
    graph_text: str = ""
    """The graph as :class:`~tunetree.signature.graph.GraphKey` prints it (display only)."""

    @property
    def identity(self) -> tuple[str, str, str]:
        """What two plans must share for this graph: path, graph and backend (kind, config)."""
        return self.path, self.graph, keys.canonical_json(self.backend)

    def to_json(self) -> dict[str, Any]:
        """This graph as JSON data."""
        return {
            "path": self.path,
            "graph": self.graph,
            "backend": self.backend,
            "graph_text": self.graph_text,
        }

    @classmethod
    def from_json(cls, fields: Fields) -> PlannedGraph:
        """Read one planned graph; raises on a malformed field."""
        graph = fields.get("graph", str)
        if not _is_hex(graph, 64):
            raise fields.fail("graph", "is not a sha256")
        backend = fields.child("backend")
        backend.get("kind", str)
        text = fields.get("graph_text", str, "")
        return cls(fields.get("path", str), graph, backend.data, text[:MAX_TEXT])


def graph_digest(key: Any) -> str:
    """A graph key as a plan records it (sha256 of its text)."""
    return _digest_text(repr(key))


def planned_graphs(plan: Plan) -> list[PlannedGraph]:
    """Every entry of ``plan`` (eager winners too) as the record keeps it."""
    return [
        PlannedGraph(
            e.path,
            graph_digest(e.key),
            keys.backend_record(e.backend),
            str(e.key)[:MAX_TEXT],
        )
        for e in plan.entries
    ]


def same_plan(recorded: list[PlannedGraph], plan: Plan) -> bool:
    """Whether ``plan`` puts the same backend on the same graphs as the recorded plan."""
    mine = sorted(g.identity for g in planned_graphs(plan))
    return mine == sorted(g.identity for g in recorded)


@dataclass
class DepthOutcome:
    """What the full search found at one depth."""

    depth: int
    status: str
    speedup: float | None = None
    """Side-by-side speed-up over the untuned model, where it was measured."""
    plan: list[PlannedGraph] = field(default_factory=list)
    """The plan kept at this depth (empty where none was measured)."""

    def to_json(self) -> dict[str, Any]:
        """This outcome as JSON data."""
        return {
            "depth": self.depth,
            "status": self.status,
            "speedup": self.speedup,
            "plan": [g.to_json() for g in self.plan],
        }

    @classmethod
    def from_json(cls, fields: Fields) -> DepthOutcome:
        """Read one depth's outcome; raises on a malformed field."""
        depth = fields.get("depth", int)
        if not 0 <= depth < 1000:
            raise fields.fail("depth", f"is {depth}, not a depth")
        status = fields.get("status", str)
        if len(status) > MAX_TEXT:
            raise fields.fail("status", f"holds {len(status)} characters")
        speedup = fields.optional("speedup", float)
        if speedup is not None and not (math.isfinite(speedup) and speedup > 0):
            raise fields.fail("speedup", f"is {speedup}, not a positive number")
        if len(fields.get("plan", list)) > MAX_PLAN_GRAPHS:
            raise fields.fail("plan", f"holds more than {MAX_PLAN_GRAPHS} graphs")
        return cls(depth, status, speedup, fields.items("plan", PlannedGraph.from_json))


@dataclass
class DepthDecision:
    """One auto_tune's choice of depth, under its key (see the module docstring)."""

    key: str
    selected: int | None
    """The selected depth; None when the model was left untuned."""
    depths: list[DepthOutcome]
    hard: dict[str, Any]
    model: str = ""
    """The model's class (display only)."""
    created: float = 0.0
    schema: int = DECISION_SCHEMA

    def outcome(self, depth: int | None) -> DepthOutcome | None:
        """The outcome recorded at ``depth`` (None when that depth was not tried)."""
        return next((d for d in self.depths if d.depth == depth), None)

    def to_json(self) -> dict[str, Any]:
        """This decision as JSON data."""
        return {
            "schema": self.schema,
            "key": self.key,
            "created": self.created,
            "model": self.model,
            "selected": self.selected,
            "depths": [d.to_json() for d in self.depths],
            "environment": {"hard": self.hard},
        }

    @classmethod
    def from_json(cls, data: Any, key: str) -> DepthDecision:
        """Validate a parsed record for ``key``; raises :class:`DecisionFault` subclasses."""
        fields = Fields(data, f"decision {key[:12]}", MalformedDecisionError)
        schema = fields.get("schema", int)
        if schema != DECISION_SCHEMA:
            raise DecisionFault(f"written by decision schema {schema}, not {DECISION_SCHEMA}")
        if fields.get("key", str) != key:
            raise DecisionFault(f"the decision is for key {str(data.get('key'))[:12]}")
        if len(fields.get("depths", list)) > MAX_DEPTHS:
            raise fields.fail("depths", f"holds more than {MAX_DEPTHS} depths")
        depths = fields.items("depths", DepthOutcome.from_json)
        if len({d.depth for d in depths}) != len(depths):
            raise fields.fail("depths", "names a depth twice")
        selected = fields.optional("selected", int)
        chosen = next((d for d in depths if d.depth == selected), None)
        if selected is not None and (chosen is None or not chosen.plan):
            raise fields.fail("selected", f"is {selected}, not a depth with a recorded plan")
        return cls(
            key,
            selected,
            depths,
            fields.child("environment").get("hard", dict),
            fields.get("model", str, "")[:MAX_TEXT],
            fields.get("created", float, 0.0),
            schema,
        )


def encode_decision(decision: DepthDecision, secret: bytes | None) -> bytes:
    """A decision's bytes: the envelope (signed with ``secret``) of a sha256 line and the JSON."""
    body = json.dumps(decision.to_json(), sort_keys=True, separators=(",", ":")).encode()
    raw = hashlib.sha256(body).hexdigest().encode() + b"\n" + body
    return seal(decision.key, raw, secret, MAGIC)


def decode_decision(data: bytes, key: str, secret: bytes | None) -> DepthDecision:
    """The checked decision in ``data`` for ``key``; :class:`DecisionFault` when unusable.

    Refused: too large, another kind of envelope, another key, unsigned or wrongly signed while
    ``secret`` is set, a checksum that fails, JSON too large or deep, a malformed field.
    """
    if len(data) > MAX_DECISION_BYTES:
        raise DecisionFault(f"the decision holds {len(data)} bytes (at most {MAX_DECISION_BYTES})")
    try:
        raw, _ = unseal(data, key, secret, MAGIC)
    except EntryFault as exc:
        raise DecisionFault(str(exc)) from exc
    head, sep, body = raw.partition(b"\n")
    if not sep or hashlib.sha256(body).hexdigest().encode() != head:
        raise DecisionFault("the decision is truncated or corrupted (checksum)")
    try:
        parsed = loads_bounded(body, MAX_DECISION_BYTES)
    except ValueError as exc:
        raise DecisionFault(f"the decision is not JSON: {exc}") from exc
    return DepthDecision.from_json(parsed, key)


# --------------------------------------------------------------------------- the key


@dataclass(frozen=True)
class DecisionIdentity:
    """The key of one auto_tune's decision and the hard environment it holds."""

    key: str
    hard: dict[str, Any]
    model: str = ""


def decision_identity(
    model: Any,
    info: ModelInfo,
    *,
    strategy: Any,
    tolerances: Any,
    accuracy: AccuracyBudget | None,
    depths: list[int],
    tie_tolerance: float,
    measure_config: MeasureConfig,
    call: CallFn | None,
) -> DecisionIdentity:
    """The key of the decision an auto_tune with these arguments makes (see the module doc)."""
    strat = keys.strategy_record(strategy)
    env = keys.environment(info.device, [b["kind"] for b in strat["backends"]])
    hard = env.hard
    roots = [[p, keys.structure_digest(m)] for p, m in sorted(root_modules(model).items())]
    signatures = sorted(
        [m.path, sorted(_digest_text(repr(k)) for k in m.graphs)]
        for m in info.modules.values()
        if m.depth == 0
    )
    record = {
        "schema": DECISION_SCHEMA,
        "kind": "auto_tune depth decision",
        "roots": roots,
        "root_called": info.root_called,
        "signatures": signatures,
        "call": keys.stable(call),
        "strategy": strat,
        "tolerances": None if tolerances is None else keys.stable(tolerances.to_json()),
        "accuracy": None if accuracy is None else keys.stable(accuracy.to_json()),
        "depths": list(depths),
        "tie_tolerance": repr(float(tie_tolerance)),
        "measure": keys.stable(measure_config),
        "device_type": info.device.type,
        "environment": hard,
        "threads": env.soft.get("threads"),
    }
    return DecisionIdentity(keys.digest(record)[:40], hard, type(model).__qualname__)


# --------------------------------------------------------------------------- the store


@dataclass
class DecisionStats:
    """What the decision store did for this cache object."""

    found: int = 0
    """Decisions read and accepted (local or remote)."""
    pulled: int = 0
    """Decisions taken from the remote tier."""
    stored: int = 0
    pushed: int = 0
    refused: int = 0
    """Records refused (malformed, forged, of another key or machine)."""


class DecisionStore:
    """Decisions under ``root/decisions`` and on the cache's remote tier (if any)."""

    def __init__(self, root: Path, remote: RemoteTier | None = None) -> None:
        self.directory = Path(root) / DIRECTORY
        self.remote = remote
        self.stats = DecisionStats()

    def _secret(self) -> bytes | None:
        """The signing key: the remote tier's, else ``$TUNETREE_CACHE_KEY``."""
        return self.remote.secret if self.remote is not None else secret_from_env()

    def get(self, ident: DecisionIdentity) -> DepthDecision | None:
        """The checked decision of ``ident``: the local one, else the remote's; None if neither.

        Never raises: a refused record is logged (and the caller searches in full).
        """
        if not is_key(ident.key):
            return None
        local = self._read_local(ident)
        if local is not None:
            return local
        data = self._pull(ident.key)
        if data is None:
            return None
        decision = self._check(data, ident, "remote")
        if decision is not None:
            self.stats.pulled += 1
            self._write_local(ident.key, data)
        return decision

    def put(self, decision: DepthDecision) -> None:
        """Record ``decision`` here and on the remote tier; logs instead of raising."""
        if not is_key(decision.key):
            return
        data = encode_decision(decision, self._secret())
        if self._write_local(decision.key, data):
            self.stats.stored += 1
        if self._push(decision.key, data):
            self.stats.pushed += 1

    # ------------------------------------------------------------------ local

    def _read_local(self, ident: DecisionIdentity) -> DepthDecision | None:
        path = self.directory / ident.key
        try:
            if not is_real_dir(self.directory):
                return None
            data = read_regular(path, MAX_DECISION_BYTES)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("tuning cache: local decision %s not used: %s", ident.key[:12], exc)
            self.stats.refused += 1
            return None
        return self._check(data, ident, "local")

    def _write_local(self, key: str, data: bytes) -> bool:
        try:
            write_atomically(self.directory, key, data)
        except OSError as exc:
            log.warning("tuning cache: could not record decision %s: %s", key[:12], exc)
            return False
        return True

    def _check(self, data: bytes, ident: DecisionIdentity, where: str) -> DepthDecision | None:
        try:
            decision = decode_decision(data, ident.key, self._secret())
            if decision.hard != ident.hard:
                raise DecisionFault("recorded in another environment (library versions or device)")
        except DecisionFault as exc:
            log.warning("tuning cache: %s decision %s not used: %s", where, ident.key[:12], exc)
            self.stats.refused += 1
            return None
        self.stats.found += 1
        return decision

    # ------------------------------------------------------------------ remote

    def _pull(self, key: str) -> bytes | None:
        """The remote record's bytes, or None: none there, or the remote cannot be used.

        A tier without the fleet's key reads nothing (:attr:`RemoteTier.unreadable`).
        """
        tier = self.remote
        if tier is None or not tier.readable():
            return None
        return get_object(tier, remote_name(key), MAX_DECISION_BYTES)

    def _push(self, key: str, data: bytes) -> bool:
        return self.remote is not None and put_object(self.remote, remote_name(key), data)


def remote_name(key: str) -> str:
    """The object name of ``key``'s decision below the remote's prefix."""
    return f"{LAYOUT}/{DIRECTORY}/{key}"
