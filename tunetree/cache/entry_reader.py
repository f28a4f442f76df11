"""Read one tuning-cache entry for a graph: validate it, load its winner, or re-measure it.

:class:`EntryReader` is :meth:`TuningCache.lookup`'s reading side (:mod:`.tuning`): the entry
of this graph's key (or, missing, one tuned for a wider range that covers it) is checked
against the key, schema, environment and strategy, then its winner is loaded and checked like
a fresh build (:mod:`.reuse`); an entry of a changed soft environment is re-measured and
replaced. A fault marks the entry invalid (never deleted by a reader).
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..candidates.evaluate import GraphSession, Status
from ..candidates.results import GraphResult
from ..candidates.strategy import Strategy
from ..signature.graph import GraphKey
from . import keys
from .entry import ArtifactRecord, EntryFault, EntryManifest, EntryMissing
from .locks import WriterLocks
from .reuse import Unusable, load_candidate, ranking, recorded_rows, select
from .store import CacheStore
from .writer import write_entry

log = logging.getLogger(__name__)


@dataclass
class CacheStats:
    """What this cache object did in this process (hits, misses, faults, stores)."""

    hits: int = 0
    misses: int = 0
    invalid: int = 0
    stored: int = 0
    remeasured: int = 0
    remote_hits: int = 0
    """Hits served from entries the remote tier materialized (counted in ``hits`` too)."""
    remote_stored: int = 0
    """Entries this process published on the remote tier."""


@dataclass
class EntryReader:
    """Reads, validates and serves the entries of one cache directory (see the module docstring).

    ``device_lock`` is the cache's own (held while re-measuring); ``writers`` its writer locks
    (taken, without waiting, to replace a re-measured entry).
    """

    disk: CacheStore
    stats: CacheStats
    writers: WriterLocks
    device_lock: Callable[[torch.device | str], contextlib.AbstractContextManager[None]]

    def read(
        self, session: GraphSession, strategy: Strategy, ident: keys.EntryIdentity
    ) -> tuple[GraphResult | None, bool]:
        """The validated result, or None; and whether the entry was missing.

        Missing is a plain miss, as opposed to an entry that exists but cannot serve.
        """
        key = ident.key
        manifest: EntryManifest | None = None
        try:
            manifest = self.disk.read_manifest(key)
            if self.disk.markers.is_marked_invalid(key, manifest.entry_id):
                log.debug("tuning cache: entry %s is marked invalid; tuning again", key[:12])
                return None, False
            _check_manifest(manifest, ident)
            if manifest.partial:
                log.debug(
                    "tuning cache: entry %s for %s %s records a race the time budget cut "
                    "short: a miss here, tuning again",
                    key[:12],
                    session.path or "<model>",
                    session.graph.key,
                )
                return None, True
            if manifest.soft != ident.environment.soft:
                result = self._remeasure(session, strategy, ident, manifest)
            else:
                result = self._load_winner(session, strategy, manifest)
        except EntryMissing:
            wider = self._wider(session, strategy, ident)
            return wider, wider is None
        except (EntryFault, Unusable) as exc:
            mark = not isinstance(exc, Unusable) or exc.mark
            self._fault(session, key, manifest, str(exc), mark)
            return None, False
        except Exception as exc:
            self._fault(session, key, manifest, f"{type(exc).__name__}: {exc}", mark=True)
            log.debug("%s", traceback.format_exc())
            return None, False
        self.disk.markers.record_hit(key)
        self.stats.hits += 1
        session.progress(session.path or "<model>", session.graph, "cache hit")
        return result, False

    def read_recorded(
        self,
        session: GraphSession,
        strategy: Strategy,
        ident: keys.EntryIdentity,
        backend: dict[str, Any],
    ) -> GraphResult | None:
        """The entry's candidate on ``backend`` (a recorded plan's choice), loaded and checked.

        Whole or cut short by the time budget, the entry serves when it records that
        candidate as usable, in this soft environment too (another thread count would call
        for measuring again); the candidate is loaded from its artifacts and checked against
        eager on the samples and probes like every hit. None (the reason logged at DEBUG)
        when it cannot serve; a candidate that no longer matches eager marks the entry
        invalid.
        """
        key, where = ident.key, session.path or "<model>"
        manifest: EntryManifest | None = None
        try:
            manifest = self.disk.read_manifest(key)
            if self.disk.markers.is_marked_invalid(key, manifest.entry_id):
                return _not_recorded(key, where, "the entry is marked invalid")
            _check_manifest(manifest, ident)
            if manifest.soft != ident.environment.soft:
                return _not_recorded(key, where, f"measured with {manifest.soft}, not here")
            rows = recorded_rows(strategy, manifest)
            index = next(
                (
                    i
                    for i, c in enumerate(manifest.candidates)
                    if c.backend.to_json() == backend and c.status is Status.OK
                ),
                None,
            )
            if index is None:
                return _not_recorded(key, where, f"no usable candidate on {backend.get('kind')}")
            runner = load_candidate(self.disk, session, rows[index], manifest.candidates[index])
            if runner is None:
                return _not_recorded(key, where, rows[index].reason)
        except EntryMissing:
            return _not_recorded(key, where, "no entry")
        except (EntryFault, Unusable) as exc:
            self._fault(session, key, manifest, str(exc), not isinstance(exc, Unusable) or exc.mark)
            return None
        rows[index].runner = runner
        self.disk.markers.record_hit(key)
        self.stats.hits += 1
        session.progress(where, session.graph, "cache hit (recorded plan)")
        text = strategy.describe() + " (cached" + (", race cut short)" if manifest.partial else ")")
        return GraphResult(session.path, session.graph, rows, rows[index], text)

    def _wider(
        self, session: GraphSession, strategy: Strategy, ident: keys.EntryIdentity
    ) -> GraphResult | None:
        """A result borrowed from an entry tuned for a wider range that covers this graph.

        The entry's winner is loaded, checked against eager on this graph's samples and on its
        own probes (the narrower range's ends, value probes) like every hit, and serves this
        graph; nothing is written.
        Entries of another environment (soft fields included) are not borrowed from.
        """
        for key in self.disk.markers.family_members(ident.family):
            if key == ident.key:
                continue
            try:
                manifest = self.disk.read_manifest(key)
                if not _covers(manifest, ident, session) or self.disk.markers.is_marked_invalid(
                    key, manifest.entry_id
                ):
                    continue
                result = self._load_winner(session, strategy, manifest)
            except Exception as exc:  # a borrowed entry never breaks the lookup
                log.debug("tuning cache: wider entry %s not used: %s", key[:12], exc)
                continue
            winner = result.winner
            if winner is None or winner.runner is None:
                continue
            result.strategy = f"{strategy.describe()} (cached for {manifest.graph_text})"
            self.disk.markers.record_hit(key)
            self.stats.hits += 1
            session.progress(session.path or "<model>", session.graph, "cache hit (wider range)")
            return result
        return None

    def _fault(
        self,
        session: GraphSession,
        key: str,
        manifest: EntryManifest | None,
        reason: str,
        mark: bool,
    ) -> None:
        where = session.path or "<model>"
        log.warning(
            "tuning cache: entry %s for %s skipped (%s); tuning again", key[:12], where, reason
        )
        self.stats.invalid += 1
        if mark:
            entry_id = manifest.entry_id if manifest is not None else None
            self.disk.markers.mark_invalid(key, entry_id, reason)

    def _load_winner(
        self, session: GraphSession, strategy: Strategy, manifest: EntryManifest
    ) -> GraphResult:
        """Load and validate only the recorded winner.

        The next recorded candidate is used when the winner can no longer be loaded.
        """
        rows = recorded_rows(strategy, manifest)
        winner = None
        if manifest.winner is not None:
            for i in ranking(strategy, rows, manifest.winner):
                runner = load_candidate(self.disk, session, rows[i], manifest.candidates[i])
                if runner is not None:
                    rows[i].runner, winner = runner, rows[i]
                    break
            if winner is None:
                raise Unusable("no recorded candidate could be loaded", mark=False)
        return GraphResult(
            session.path, session.graph, rows, winner, strategy.describe() + " (cached)"
        )

    def _remeasure(
        self,
        session: GraphSession,
        strategy: Strategy,
        ident: keys.EntryIdentity,
        manifest: EntryManifest,
    ) -> GraphResult:
        """Soft fields changed: reload and re-measure the recorded candidates and replace the entry.

        Every recorded usable candidate is loaded (no rebuild) and measured again, the strategy
        chooses, and the entry is replaced with the new numbers.
        """
        session.progress(
            session.path or "<model>", session.graph, "cache: environment changed, re-measuring"
        )
        rows = recorded_rows(strategy, manifest)
        reused: dict[int, ArtifactRecord] = {}
        for i, (row, record) in enumerate(zip(rows, manifest.candidates, strict=True)):
            if row.status is not Status.OK:
                continue
            row.timing = None
            runner = load_candidate(self.disk, session, row, record)
            if runner is not None and record.artifact is not None:
                row.runner = runner
                reused[i] = record.artifact
        if any(r.status is Status.OK for r in rows) and not reused:
            raise Unusable("no recorded candidate could be loaded", mark=False)
        with self.device_lock(session.device):
            session.measure(rows)
        measured = [r for r in rows if r.usable and r.timing is not None]
        winner = select(strategy, measured) if measured else None
        text = strategy.describe() + " (re-measured)"
        result = GraphResult(session.path, session.graph, rows, winner, text)
        if self.writers.acquire(ident.key, session, wait=False):
            try:
                write_entry(self.disk, session, ident, result, reused=reused, replace=True)
            except Exception as exc:
                log.warning("tuning cache: could not update %s: %s", ident.key[:12], exc)
            finally:
                self.writers.release(ident.key)
        self.stats.remeasured += 1
        return result


def _not_recorded(key: str, where: str, reason: str) -> GraphResult | None:
    """Log why an entry cannot serve a recorded plan's graph; None, for the caller to return."""
    log.debug(
        "tuning cache: entry %s for %s cannot serve the recorded plan: %s", key[:12], where, reason
    )
    return None


def _incompatibility(
    manifest: EntryManifest, ident: keys.EntryIdentity, key: str | None = None
) -> str | None:
    """Why the entry cannot serve ``ident`` (whatever its graph, unless ``key`` is given), or None.

    Checks the schema, the entry's key when ``key`` is given, the hard environment and the
    strategy's candidates, in that order.
    """
    if manifest.schema != keys.SCHEMA:
        return f"written by cache schema {manifest.schema}, not {keys.SCHEMA}"
    if key is not None and manifest.key != key:
        return f"manifest is for key {manifest.key[:12]}"
    if manifest.hard != ident.environment.hard:
        return "tuned in another environment (library versions or device)"
    if [c.backend.to_json() for c in manifest.candidates] != ident.strategy["backends"]:
        return "its candidates differ from the strategy's"
    return None


def compatible_with(ident: keys.EntryIdentity, whole: bool = False) -> Any:
    """The remote tier's check of an entry for ``ident`` (before anything is downloaded).

    ``whole``: for pushing a whole race, which replaces a remote entry cut short.
    """

    def check(manifest: EntryManifest) -> str | None:
        if whole and manifest.partial:
            return "the time budget cut its race short"
        return _incompatibility(manifest, ident, ident.key)

    return check


def _check_manifest(manifest: EntryManifest, ident: keys.EntryIdentity) -> None:
    """The manifest belongs to this key, schema, environment and strategy."""
    reason = _incompatibility(manifest, ident, ident.key)
    if reason is not None:
        raise EntryFault(reason)


def _covers(manifest: EntryManifest, ident: keys.EntryIdentity, session: GraphSession) -> bool:
    """The entry is of this graph's family, environment and strategy, for a range covering it."""
    if (
        manifest.family != ident.family
        or manifest.partial
        or manifest.graph_key is None
        or manifest.soft != ident.environment.soft
        or _incompatibility(manifest, ident) is not None
    ):
        return False
    try:
        recorded = GraphKey.from_json(manifest.graph_key)
    except ValueError:
        return False
    return recorded.covers(session.graph.key)
