""":class:`TuningCache`: the :class:`~tunetree.candidates.results.GraphCache` ``tune`` asks.

A hit reads only that entry's manifest and its winner's artifacts (a partial load),
rebuilds the winner's runner and checks it like a fresh build before using it: against
eager on the recorded samples and on the graph's probes (:mod:`.reuse`).
Every recorded candidate row comes back (status, reason, latency), so losers are never
rebuilt.

* Soft environment changes (thread count, driver): the recorded candidates that were
  usable are loaded (not rebuilt), validated, re-measured under the device lock, the
  strategy picks again, and the entry is replaced by one with the new measurements.
* Faults (missing, truncated, corrupted or malformed files, another schema or
  environment): the entry is marked invalid (never deleted by a reader) and the graph tuned
  again. A winner that fails to load (its backend no longer imports) gives way to the next
  recorded candidate; a winner whose outputs no longer match eager re-tunes the graph.
* Reading an entry (validation, the winner's load, re-measuring): :mod:`.entry_reader`.
* Concurrency: see :mod:`tunetree.cache.locks`. On a miss the session's measurements hold
  the device lock through :attr:`GraphSession.measure_lock`.
* Remote tier (``remote=`` or ``$TUNETREE_CACHE_REMOTE``, :mod:`tunetree.cache.remote`): a
  local miss asks the remote, which materializes its entry into this cache, and the lookup
  then serves it as a local hit (validated the same way); a stored entry is pushed there too.
* :attr:`TuningCache.decisions` keeps ``auto_tune``'s depth decisions beside the entries,
  locally and on the remote tier (:mod:`tunetree.cache.decisions`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from pathlib import Path
from typing import Any

import filelock
import torch

from ..candidates.evaluate import GraphSession
from ..candidates.results import GraphCache, GraphResult
from ..candidates.strategy import Strategy
from ..errors import CacheError, MissingDependencyError
from . import keys, maintenance, selection, sync
from .decisions import DecisionStore
from .entry import EntryFault
from .entry_reader import CacheStats, EntryReader, compatible_with
from .locks import WriterLocks, device_lock
from .maintenance import EntryInfo, GcReport
from .remote import ENV_REMOTE, RemoteTier, open_remote
from .store import CacheStore
from .sync import SyncReport
from .writer import write_entry

log = logging.getLogger(__name__)

ENV_DIR = "TUNETREE_CACHE_DIR"
"""Environment variable naming the cache directory."""


def default_directory() -> Path:
    """``$TUNETREE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tunetree``, else ``~/.cache/tunetree``."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "tunetree"


class TuningCache:
    """A tuning cache: graphs tuned before are loaded instead of built, checked before they serve.

    Pass it as ``cache=`` to :func:`tunetree.tune` or :func:`tunetree.auto_tune` (the
    default directory is used without one); the module docstring says what an entry holds
    and how it is validated.

    Args:
        directory: Where entries live, created if needed (None: :func:`default_directory`).
        remote: An ``s3://BUCKET/PREFIX`` shared by the hosts of a fleet (a
            :class:`~tunetree.cache.remote.RemoteTier` for other timeouts or a signing key;
            None: ``$TUNETREE_CACHE_REMOTE``; False: none); needs ``tunetree[remote]``.
        lock_timeout_s: How long a miss waits for another process tuning the same graph,
            and a measurement for the device lock; after it, work goes on without the lock.
        trust_unsigned: Read remote entries not signed with ``$TUNETREE_CACHE_KEY`` (see
            :class:`~tunetree.cache.remote.RemoteTier`).

    Raises:
        CacheError: A ``directory`` that cannot be used, or a ``remote`` that is not an
            ``s3://`` URL.
        MissingDependencyError: A remote without ``boto3`` installed.

    Example:
        >>> import tempfile, torch, tunetree as tt
        >>> cache = tt.TuningCache(tempfile.mkdtemp(), remote=False)
        >>> model = torch.nn.Linear(8, 8).eval()
        >>> for _ in range(2):
        ...     result = tt.tune(model, [torch.randn(2, 8)], cache=cache, verbose=False,
        ...         strategy=tt.OneBackendStrategy(tt.backends.Eager()),
        ...         measure_config=tt.MeasureConfig.quick())
        >>> cache.stats.stored, result.graphs[0].cached
        (1, True)
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        remote: str | RemoteTier | bool | None = None,
        lock_timeout_s: float = 1800.0,
        trust_unsigned: bool | None = None,
    ):
        self.remote: RemoteTier | None = open_remote(remote, trust_unsigned)
        self.disk = CacheStore(Path(default_directory() if directory is None else directory))
        self.lock_timeout_s = lock_timeout_s
        self.stats = CacheStats()
        self._writers = WriterLocks(self.disk.locks, lock_timeout_s)
        self._identities: dict[int, keys.EntryIdentity] = {}
        self._reader = EntryReader(
            self.disk, self.stats, self._writers, lambda device: self.device_lock(device)
        )
        self._refused = False  # a store failed for the file system's reasons (warned once)
        self.decisions = DecisionStore(self.disk.root, self.remote)
        """``auto_tune``'s depth decisions (:mod:`tunetree.cache.decisions`)."""

    @property
    def directory(self) -> Path:
        """The cache's root directory."""
        return self.disk.root

    def __repr__(self) -> str:
        remote = f", remote={self.remote.url!r}" if self.remote is not None else ""
        return f"TuningCache({str(self.directory)!r}{remote})"

    # ------------------------------------------------------------------ GraphCache protocol

    def lookup(self, session: GraphSession, strategy: Strategy) -> GraphResult | None:
        """A validated earlier result for this graph, or None.

        On a miss this process becomes the graph's writer: it takes the per-key lock (waiting while
        another process tunes the same graph, then looking again) and the session's measurements
        take the device lock. Never raises for cache problems.
        """
        self._writers.release_all()
        self._identities.clear()
        try:
            ident = keys.entry_identity(session, strategy)
        except Exception as exc:
            log.warning("tuning cache: cannot key %s: %s", session.path or "<model>", exc)
            return None
        self._identities[id(session)] = ident
        result, missing = self._reader.read(session, strategy, ident)
        if result is None and self._pull(ident):
            # The remote's entry is local now: it is served, and validated, as a local hit.
            result, missing = self._reader.read(session, strategy, ident)
            self.stats.remote_hits += result is not None
        if result is None and self._writers.acquire(ident.key, session) and missing:
            # Another process may have published the entry since we looked: look again.
            result, _ = self._reader.read(session, strategy, ident)
        if result is not None:
            self._writers.release(ident.key)
            self._identities.pop(id(session), None)
            return result
        self.stats.misses += 1
        log.debug(
            "tuning cache: miss for %s %s (key %s): %s",
            session.path or "<model>",
            session.graph.key,
            ident.key[:12],
            "no entry" if missing else "its entry cannot serve it (logged above)",
        )
        session.measure_lock = lambda: self.device_lock(session.device)
        return None

    def lookup_recorded(
        self, session: GraphSession, strategy: Strategy, backend: dict[str, Any]
    ) -> GraphResult | None:
        """The candidate on ``backend`` of this graph's entry, loaded and checked; or None.

        For a plan recorded by an earlier tune (``backend`` as
        :func:`tunetree.cache.keys.backend_record` gives it): the entry serves even when the
        time budget cut its race short, nothing is raced or measured, and the candidate is
        checked against eager like every hit. Asks the remote tier when there is no local
        entry. Never raises for cache problems; takes no writer lock (nothing is built).
        """
        try:
            ident = keys.entry_identity(session, strategy)
        except Exception as exc:
            log.warning("tuning cache: cannot key %s: %s", session.path or "<model>", exc)
            return None
        result = self._reader.read_recorded(session, strategy, ident, backend)
        if result is None and self._pull(ident):
            result = self._reader.read_recorded(session, strategy, ident, backend)
            self.stats.remote_hits += result is not None
        return result

    def store(self, session: GraphSession, strategy: Strategy, result: GraphResult) -> None:
        """Record a freshly tuned graph: every candidate's row and usable candidates' artifacts.

        A race the time budget cut short is recorded too, as a partial entry: it serves only
        :meth:`lookup_recorded` (a plan that chose one of its candidates), a lookup takes it
        for a miss, and the whole race replaces it. Logs instead of raising on I/O problems.
        """
        ident = self._identities.pop(id(session), None)
        try:
            if ident is None:
                ident = keys.entry_identity(session, strategy)
            write_entry(self.disk, session, ident, result, reused={})
            self.stats.stored += 1
            if self.remote is not None and self.remote.push(
                ident.key, self.disk, compatible_with(ident, not result.cut_short)
            ):
                self.stats.remote_stored += 1
        except Exception as exc:  # a local cache refusing writes warns once, not per graph
            level = logging.INFO if isinstance(exc, OSError) and self._refused else logging.WARNING
            self._refused = self._refused or isinstance(exc, OSError)
            log.log(level, "tuning cache: could not store %s: %s", session.path or "<model>", exc)
            log.debug("%s", traceback.format_exc())
        finally:
            if ident is not None:
                self._writers.release(ident.key)

    # ------------------------------------------------------------------ tools

    def entries(self, deep: bool = False) -> list[EntryInfo]:
        """Every entry (``deep`` also checks every artifact's sha256)."""
        return [maintenance.entry_info(self.disk, key, deep) for key in self.disk.entry_keys()]

    def verify(self) -> list[EntryInfo]:
        """Check every checksum; entries found unusable are marked invalid and returned."""
        bad = []
        for info in self.entries(deep=True):
            if info.problem is not None:
                entry_id = None
                with contextlib.suppress(EntryFault):
                    entry_id = self.disk.read_manifest(info.key).entry_id
                if not info.problem.startswith("marked invalid"):
                    self.disk.markers.mark_invalid(info.key, entry_id, info.problem)
                bad.append(info)
        return bad

    def gc(self, max_size: int | None = None) -> GcReport:
        """Remove invalid entries, dead writers' orphans, unreferenced artifacts and LRU overflow.

        Least-recently-used entries are removed until the cache holds at most ``max_size`` bytes.
        """
        lock = filelock.FileLock(str(self.disk.locks / "gc.lock"))
        with lock.acquire(timeout=self.lock_timeout_s):
            return maintenance.gc(self.disk, max_size)

    def push(self, model: Any = None) -> SyncReport:
        """Publish local entries on the remote tier: ``model``'s (a module or class name) or all.

        CacheError when this cache has no remote.
        """
        return sync.push(self.disk, self._remote(), selection.for_model(model))

    def pull(self, model: Any = None) -> SyncReport:
        """Fetch remote entries measured on this kind of machine: ``model``'s, or all.

        They are validated like any local entry when a lookup serves them.
        """
        return sync.pull(self.disk, self._remote(), selection.for_model(model))

    def _remote(self) -> RemoteTier:
        if self.remote is None:
            raise CacheError(
                "this tuning cache has no remote tier: TuningCache(remote='s3://BUCKET/PREFIX') "
                "or $TUNETREE_CACHE_REMOTE"
            )
        return self.remote

    def device_lock(self, device: torch.device | str) -> contextlib.AbstractContextManager[None]:
        """Held around measurements so concurrent tuners on one device do not disturb each other.

        See :func:`tunetree.cache.locks.device_lock`.
        """
        return device_lock(self.disk.locks, device, self.lock_timeout_s)

    def close(self) -> None:
        """Release any writer lock still held (a tune that stopped between lookup and store)."""
        self._writers.release_all()

    def _pull(self, ident: keys.EntryIdentity) -> bool:
        """Ask the remote tier for this key's entry; True when it put one into this cache."""
        if self.remote is None:
            return False
        return self.remote.pull(ident.key, self.disk, compatible_with(ident))


def open_cache(cache: Any = None) -> GraphCache | None:
    """Resolve a ``cache=`` argument to a cache or None.

    None or True → the default directory (:func:`default_directory`), False → no cache, a path → a
    cache there, a :class:`TuningCache` (or any object with ``lookup``/``store``) → itself.

    A default directory that cannot be created only disables caching (with a warning); an
    explicit one raises :class:`~tunetree.errors.CacheError`.
    """
    if cache is False:
        return None
    if cache is None or cache is True:
        try:
            return TuningCache(remote=_remote_from_env())
        except CacheError as exc:
            log.warning("tuning cache disabled: %s", exc)
            return None
    if isinstance(cache, str | os.PathLike):
        return TuningCache(cache, remote=_remote_from_env())
    if hasattr(cache, "lookup") and hasattr(cache, "store"):
        return cache  # type: ignore[no-any-return]
    raise CacheError(
        f"cache= takes a TuningCache, a directory, True/None (default directory) or False, "
        f"not {type(cache).__name__}"
    )


def _remote_from_env() -> RemoteTier | bool:
    """``$TUNETREE_CACHE_REMOTE`` as a remote tier; False (with a warning) when it cannot be used.

    The remote never breaks tuning: a malformed URL or a missing boto3 leaves the local cache.
    """
    try:
        return open_remote(None) or False
    except (CacheError, MissingDependencyError) as exc:
        log.warning("tuning cache: %s is not used: %s", ENV_REMOTE, exc)
        return False
