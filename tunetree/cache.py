"""The persistent tuning cache: the same graph of the same module, tuned with the same
strategy in the same environment, is never tuned twice, across processes and restarts.

:class:`TuningCache` is what :func:`tunetree.tune` and :func:`tunetree.auto_tune` consult
per graph before building anything (``cache=``; on by default, in ``TUNETREE_CACHE_DIR``
or ``~/.cache/tunetree``; ``cache=False`` turns it off). A hit reads only that entry's
manifest and its winner's artifacts (a partial load), rebuilds the winner's runner with
:meth:`Backend.load <tunetree.backends.Backend.load>`, and re-validates its outputs against
eager on the current samples before using it. Every recorded candidate row comes back
(status, reason, latency), so losers are never rebuilt.

* Key composition: :mod:`tunetree.cache_keys`. On-disk layout: :mod:`tunetree.cache_store`.
* Soft environment changes (thread count, driver): the recorded candidates that were
  usable are loaded (not rebuilt), validated, re-measured under the device lock, the
  strategy picks again, and the entry is replaced by one with the new measurements.
* Faults (missing, truncated or corrupted files, another schema or environment): the entry
  is marked invalid (never deleted by a reader) and the graph tuned again. A winner that
  fails to load (its backend no longer imports) gives way to the next recorded candidate;
  a winner whose outputs no longer match eager (weights changed) re-tunes the graph.
* Concurrency: readers take no locks. A miss takes a per-key :mod:`filelock` so a second
  process tuning the same graph waits and then hits instead of duplicating the work;
  publishing is a rename, and a loser keeps the winner's entry when it is valid.
  Measurements of a missed graph hold a per-device lock (:meth:`TuningCache.device_lock`)
  so concurrent tuners do not disturb each other's timings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
import traceback
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock
import torch

from . import cache_keys
from .backends.base import Backend, Runner
from .cache_store import (
    JOURNAL,
    CacheStore,
    EntryFault,
    EntryInfo,
    EntryMissing,
    GcReport,
    remove_tree,
)
from .compare import Comparison, compare_all
from .errors import CacheError
from .evaluate import CandidateRow, GraphSession, Status
from .measure import Timing
from .strategy import Strategy

if TYPE_CHECKING:
    from .tune import GraphCache, GraphResult

log = logging.getLogger(__name__)

ENV_DIR = "TUNETREE_CACHE_DIR"
"""Environment variable naming the cache directory."""

KILL_HOOK_ENV = "TUNETREE_CACHE_TEST_KILL_AT"
"""Test hook: ``after-artifact``, ``before-manifest`` or ``before-rename`` makes a writer
SIGKILL itself at that step, so tests can check that a killed writer harms nothing."""

KILL_POINTS = ("after-artifact", "before-manifest", "before-rename")


def default_directory() -> Path:
    """``$TUNETREE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tunetree``, else ``~/.cache/tunetree``."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "tunetree"


def _kill_point(step: str) -> None:
    """Test hook (see :data:`KILL_HOOK_ENV`): die here, as a killed writer would."""
    if os.environ.get(KILL_HOOK_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class CacheStats:
    """What this cache object did in this process (hits, misses, faults, stores)."""

    hits: int = 0
    misses: int = 0
    invalid: int = 0
    stored: int = 0
    remeasured: int = 0


class _Unusable(Exception):
    """The entry cannot serve this lookup; the graph is tuned again."""

    def __init__(self, reason: str, mark: bool = True) -> None:
        super().__init__(reason)
        self.mark = mark


class TuningCache:
    """A tuning cache in ``directory`` (created if needed); see the module docstring.

    ``lock_timeout_s`` bounds how long a miss waits for another process tuning the same
    graph, and a measurement for the device lock; after it, work goes on without the lock.
    """

    def __init__(self, directory: str | os.PathLike[str], *, lock_timeout_s: float = 1800.0):
        self.store_ = CacheStore(Path(directory))
        self.lock_timeout_s = lock_timeout_s
        self.stats = CacheStats()
        self._held: dict[str, filelock.BaseFileLock] = {}
        self._identities: dict[int, cache_keys.EntryIdentity] = {}

    @property
    def directory(self) -> Path:
        return self.store_.root

    def __repr__(self) -> str:
        return f"TuningCache({str(self.directory)!r})"

    # ------------------------------------------------------------------ GraphCache protocol

    def lookup(self, session: GraphSession, strategy: Strategy) -> GraphResult | None:
        """A validated earlier result for this graph, or None. On a miss this process
        becomes the graph's writer: it takes the per-key lock (waiting while another process
        tunes the same graph, then looking again) and the session's measurements take the
        device lock. Never raises for cache problems."""
        self._release_held()
        self._identities.clear()
        try:
            ident = cache_keys.entry_identity(session, strategy)
        except Exception as exc:
            log.warning("tuning cache: cannot key %s: %s", session.path or "<model>", exc)
            return None
        self._identities[id(session)] = ident
        result, missing = self._lookup(session, strategy, ident)
        if result is None and self._acquire(ident.key, session) and missing:
            # Another process may have published the entry since we looked: look again.
            result, _ = self._lookup(session, strategy, ident)
        if result is not None:
            self._release(ident.key)
            self._identities.pop(id(session), None)
            return result
        self.stats.misses += 1
        self._lock_measurements(session)
        return None

    def store(self, session: GraphSession, strategy: Strategy, result: GraphResult) -> None:
        """Record a freshly tuned graph: every candidate's row, and the artifacts of every
        usable candidate. Logs instead of raising on I/O problems."""
        ident = self._identities.pop(id(session), None)
        try:
            if ident is None:
                ident = cache_keys.entry_identity(session, strategy)
            self._write(session, ident, result, reused={})
            self.stats.stored += 1
        except Exception as exc:
            log.warning("tuning cache: could not store %s: %s", session.path or "<model>", exc)
            log.debug("%s", traceback.format_exc())
        finally:
            if ident is not None:
                self._release(ident.key)

    # ------------------------------------------------------------------ tools

    def entries(self, deep: bool = False) -> list[EntryInfo]:
        """Every entry (``deep`` also checks every artifact's sha256)."""
        return [self.store_.entry_info(key, deep) for key in self.store_.entry_keys()]

    def verify(self) -> list[EntryInfo]:
        """Check every checksum; entries found unusable are marked invalid and returned."""
        bad = []
        for info in self.entries(deep=True):
            if info.problem is not None:
                entry_id = None
                with contextlib.suppress(EntryFault):
                    entry_id = self.store_.read_manifest(info.key).get("entry_id")
                if not info.problem.startswith("marked invalid"):
                    self.store_.mark_invalid(info.key, entry_id, info.problem)
                bad.append(info)
        return bad

    def gc(self, max_size: int | None = None) -> GcReport:
        """Remove invalid entries, orphans of dead writers and unreferenced artifacts, then
        least-recently-used entries until the cache holds at most ``max_size`` bytes."""
        lock = filelock.FileLock(str(self.store_.locks / "gc.lock"))
        with lock.acquire(timeout=self.lock_timeout_s):
            return self.store_.gc(max_size)

    def closure(self, key: str) -> list[Path]:
        """The files one entry's plan reaches: its manifest and its winner's artifacts (what
        a checkpoint copies)."""
        body = self.store_.read_manifest(key)
        files = [self.store_.entries / key / "manifest.json"]
        winner = body.get("winner")
        if isinstance(winner, int):
            artifact = body["candidates"][winner].get("artifact") or {}
            files += [self.store_.artifact_path(r["sha256"]) for r in artifact.get("files", [])]
        return files

    @contextlib.contextmanager
    def device_lock(self, device: torch.device | str) -> Iterator[None]:
        """Held around measurements so concurrent tuners on one device do not disturb each
        other's timings. After ``lock_timeout_s``, or where the lock cannot be created, the
        caller measures without it."""
        dev = torch.device(device)
        name = dev.type if dev.index is None else f"{dev.type}-{dev.index}"
        lock = filelock.FileLock(str(self.store_.locks / f"device-{name}.lock"))
        try:
            lock.acquire(timeout=self.lock_timeout_s)
        except (filelock.Timeout, OSError) as exc:  # busy too long, or a read-only cache
            log.warning("tuning cache: measuring on %s without its lock (%s)", dev, exc)
            yield
            return
        try:
            yield
        finally:
            lock.release()

    def close(self) -> None:
        """Release any writer lock still held (a tune that stopped between lookup and store)."""
        self._release_held()

    # ------------------------------------------------------------------ lookup internals

    def _lookup(
        self, session: GraphSession, strategy: Strategy, ident: cache_keys.EntryIdentity
    ) -> tuple[GraphResult | None, bool]:
        """The validated result, or None; and whether the entry was missing (a plain miss,
        as opposed to an entry that exists but cannot serve)."""
        key = ident.key
        body: dict[str, Any] | None = None
        try:
            body = self.store_.read_manifest(key)
            if self.store_.is_marked_invalid(key, body):
                log.debug("tuning cache: entry %s is marked invalid; tuning again", key[:12])
                return None, False
            self._check_body(body, ident)
            if body["environment"]["soft"] != ident.environment.soft:
                result = self._remeasure(session, strategy, ident, body)
            else:
                result = self._load_winner(session, strategy, body)
        except EntryMissing:
            return None, True
        except (EntryFault, _Unusable) as exc:
            mark = not isinstance(exc, _Unusable) or exc.mark
            self._fault(session, key, body, str(exc), mark)
            return None, False
        except Exception as exc:
            self._fault(session, key, body, f"{type(exc).__name__}: {exc}", mark=True)
            log.debug("%s", traceback.format_exc())
            return None, False
        self.store_.record_hit(key)
        self.stats.hits += 1
        session.progress(session.path or "<model>", session.graph, "cache hit")
        return result, False

    def _fault(
        self,
        session: GraphSession,
        key: str,
        body: dict[str, Any] | None,
        reason: str,
        mark: bool,
    ) -> None:
        where = session.path or "<model>"
        log.warning(
            "tuning cache: entry %s for %s skipped (%s); tuning again", key[:12], where, reason
        )
        self.stats.invalid += 1
        if mark:
            self.store_.mark_invalid(key, body.get("entry_id") if body else None, reason)

    def _check_body(self, body: dict[str, Any], ident: cache_keys.EntryIdentity) -> None:
        """The manifest belongs to this key, schema, environment and strategy."""
        if body.get("schema") != cache_keys.SCHEMA:
            raise EntryFault(
                f"written by cache schema {body.get('schema')}, not {cache_keys.SCHEMA}"
            )
        if body.get("key") != ident.key:
            raise EntryFault(f"manifest is for key {str(body.get('key'))[:12]}")
        env = body.get("environment")
        if not isinstance(env, dict) or env.get("hard") != ident.environment.hard:
            raise EntryFault("tuned in another environment (library versions or device)")
        recorded = [c.get("backend") for c in body.get("candidates", [])]
        if recorded != ident.strategy["backends"]:
            raise EntryFault("its candidates differ from the strategy's")

    def _rows(self, strategy: Strategy, body: dict[str, Any]) -> list[CandidateRow]:
        """The recorded candidate rows, with the strategy's own backend objects."""
        rows = []
        for backend, record in zip(strategy.backends, body["candidates"], strict=True):
            timing = record.get("timing")
            rows.append(
                CandidateRow(
                    backend,
                    Status(record["status"]),
                    str(record.get("reason", "")),
                    record.get("build_s"),
                    record.get("max_abs_diff"),
                    Timing(**timing) if isinstance(timing, dict) else None,
                    int(record.get("batch", 1)),
                    record.get("max_batch_size"),
                )
            )
        return rows

    def _load_winner(
        self, session: GraphSession, strategy: Strategy, body: dict[str, Any]
    ) -> GraphResult:
        """Load and validate only the recorded winner (the next recorded candidate when the
        winner can no longer be loaded)."""
        rows = self._rows(strategy, body)
        winner_index = body.get("winner")
        winner = None
        if isinstance(winner_index, int):
            for i in _ranking(strategy, rows, winner_index):
                runner = self._load_candidate(session, rows[i], body["candidates"][i])
                if runner is not None:
                    rows[i].runner, winner = runner, rows[i]
                    break
            if winner is None:
                raise _Unusable("no recorded candidate could be loaded", mark=False)
        return _graph_result(session, rows, winner, strategy.describe() + " (cached)")

    def _remeasure(
        self,
        session: GraphSession,
        strategy: Strategy,
        ident: cache_keys.EntryIdentity,
        body: dict[str, Any],
    ) -> GraphResult:
        """Soft fields changed: load every recorded usable candidate (no rebuild), measure
        them again, let the strategy choose, and replace the entry with the new numbers."""
        session.progress(
            session.path or "<model>", session.graph, "cache: environment changed, re-measuring"
        )
        rows = self._rows(strategy, body)
        reused: dict[int, dict[str, Any]] = {}
        for i, (row, record) in enumerate(zip(rows, body["candidates"], strict=True)):
            if row.status is not Status.OK:
                continue
            row.timing = None
            runner = self._load_candidate(session, row, record)
            if runner is not None:
                row.runner = runner
                reused[i] = record.get("artifact")
        if any(r.status is Status.OK for r in rows) and not reused:
            raise _Unusable("no recorded candidate could be loaded", mark=False)
        with self.device_lock(session.device):
            session.measure(rows)
        measured = [r for r in rows if r.usable and r.timing is not None]
        winner = _select(strategy, measured) if measured else None
        result = _graph_result(session, rows, winner, strategy.describe() + " (re-measured)")
        if self._acquire(ident.key, session, wait=False):
            try:
                self._write(session, ident, result, reused=reused, replace=True)
            except Exception as exc:
                log.warning("tuning cache: could not update %s: %s", ident.key[:12], exc)
            finally:
                self._release(ident.key)
        self.stats.remeasured += 1
        return result

    def _load_candidate(
        self, session: GraphSession, row: CandidateRow, record: dict[str, Any]
    ) -> Runner | None:
        """The candidate's runner rebuilt from its artifacts and checked against eager, or
        None when it cannot be loaded (the row becomes a failure). Raises for corrupted
        artifacts (the whole entry is invalid) and for outputs that differ from eager."""
        artifact = record.get("artifact")
        if not isinstance(artifact, dict) or "files" not in artifact:
            row.status, row.reason = Status.FAILED, "cache: its runner was not saved"
            return None
        directory = self.store_.materialize(list(artifact["files"]))
        try:
            runner = row.backend.load(
                session.module,
                session.graph.key,
                directory,
                dict(artifact.get("description") or {}),
                session.device,
            )
            comparison = _validate(session, row.backend, runner)
        except Exception as exc:
            remove_tree(directory)
            log.info("tuning cache: %s could not be loaded: %s", row.backend.name, exc)
            row.status, row.reason = Status.FAILED, f"cache: load: {type(exc).__name__}: {exc}"
            row.timing = None
            return None
        if not comparison.ok:
            remove_tree(directory)
            raise _Unusable(f"{row.backend.name} no longer matches eager: {comparison.reason}")
        # The files live as long as the runner (a backend may read them lazily); for a
        # runner without weak references, gc removes them once this process has ended.
        with contextlib.suppress(TypeError):
            weakref.finalize(runner, remove_tree, directory)
        row.max_abs_diff = comparison.max_abs_diff
        return runner

    # ------------------------------------------------------------------ writing

    def _write(
        self,
        session: GraphSession,
        ident: cache_keys.EntryIdentity,
        result: GraphResult,
        reused: dict[int, dict[str, Any]],
        replace: bool = False,
    ) -> None:
        """Stage artifacts and the manifest (last), then rename the entry into place."""
        candidates_of_rows = [cache_keys.backend_record(r.backend) for r in result.rows]
        if candidates_of_rows != ident.strategy["backends"]:
            log.info("tuning cache: not storing %s: not one row per candidate", ident.key[:12])
            return
        staging = self.store_.new_temporary("entry")
        try:
            journal = staging / JOURNAL
            journal.touch()
            candidates = []
            for i, row in enumerate(result.rows):
                artifact: dict[str, Any] | None = reused.get(i)
                if artifact is not None:
                    self.store_.keep_artifacts(_files({"artifact": artifact}), journal)
                elif row.usable and row.runner is not None:
                    artifact = self._save_runner(row.runner, staging / f"save-{i}", journal)
                candidates.append(_candidate_record(row, artifact, ident.candidate_keys[i]))
            winner = next((i for i, r in enumerate(result.rows) if r is result.winner), None)
            body = {
                "schema": cache_keys.SCHEMA,
                "key": ident.key,
                "entry_id": uuid.uuid4().hex,
                "created": time.time(),
                "path": session.path,
                "graph_text": str(session.graph.key),
                "graph": ident.graph,
                "module": ident.module,
                "strategy": ident.strategy,
                "strategy_text": result.strategy,
                "tolerances": ident.tolerances,
                "environment": {
                    "hard": ident.environment.hard,
                    "soft": ident.environment.soft,
                },
                "edges": {
                    "children": {name: d for name, d in ident.module["children"]},
                    "artifacts": sorted({f["sha256"] for c in candidates for f in _files(c)}),
                },
                "candidates": candidates,
                "winner": winner,
            }
            _kill_point("before-manifest")
            self.store_.write_manifest(staging, body)
            _kill_point("before-rename")
            if replace:
                self.store_.retire(ident.key)
            hard = ident.environment.hard
            published = self.store_.publish(
                staging,
                ident.key,
                lambda other: (
                    other.get("schema") == cache_keys.SCHEMA
                    and other.get("environment", {}).get("hard") == hard
                ),
            )
            if published:
                self.store_.touch_hits(ident.key)
        except BaseException:
            remove_tree(staging)
            raise

    def _save_runner(self, runner: Runner, directory: Path, journal: Path) -> dict[str, Any]:
        """``runner.save`` into a staging directory, each file moved into the artifact store."""
        directory.mkdir()
        try:
            description = runner.save(directory)
            description = json_roundtrip(description)
        except Exception as exc:
            log.info("tuning cache: %s runner not saved: %s", runner.backend.name, exc)
            return {"error": f"{type(exc).__name__}: {exc}"}
        files = []
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            rel = path.relative_to(directory).as_posix()
            sha, size = self.store_.put_artifact(path, journal)
            files.append({"path": rel, "sha256": sha, "size": size})
            _kill_point("after-artifact")
        remove_tree(directory)
        return {"description": description, "files": files}

    # ------------------------------------------------------------------ locks

    def _acquire(self, key: str, session: GraphSession, wait: bool = True) -> bool:
        """Take the per-key writer lock, waiting up to ``lock_timeout_s`` while another
        process holds it (it is tuning this graph). False when not taken (timed out, busy
        with ``wait=False``, or locks unsupported here): the caller goes on without it."""
        lock = filelock.FileLock(str(self.store_.locks / f"{key}.lock"))
        try:
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                if not wait:
                    return False
                session.progress(
                    session.path or "<model>",
                    session.graph,
                    "cache: another process is tuning this graph; waiting",
                )
                lock.acquire(timeout=self.lock_timeout_s)
        except filelock.Timeout:
            log.warning("tuning cache: tuning %s without its lock (timed out)", key[:12])
            return False
        except OSError as exc:
            log.debug("tuning cache: no writer lock for %s: %s", key[:12], exc)
            return False
        self._held[key] = lock
        return True

    def _release(self, key: str) -> None:
        lock = self._held.pop(key, None)
        if lock is not None:
            with contextlib.suppress(Exception):
                lock.release(force=True)

    def _release_held(self) -> None:
        for key in list(self._held):
            self._release(key)

    def _lock_measurements(self, session: GraphSession) -> None:
        """Make this session's measurements hold the device lock (tune_cut measures through
        ``session.measure``; wrapping it here keeps evaluate.py free of cache concerns)."""
        measure = session.measure
        cache = self

        def locked(rows: list[CandidateRow]) -> None:
            with cache.device_lock(session.device):
                measure(rows)

        session.measure = locked  # type: ignore[method-assign]


# --------------------------------------------------------------------------- helpers


def json_roundtrip(value: Any) -> Any:
    """``value`` as it reads back from JSON; refuses what JSON cannot hold."""
    return json.loads(json.dumps(value))


def _files(candidate: dict[str, Any]) -> list[dict[str, Any]]:
    artifact = candidate.get("artifact") or {}
    return list(artifact.get("files", []))


def _candidate_record(
    row: CandidateRow, artifact: dict[str, Any] | None, candidate_key: str
) -> dict[str, Any]:
    timing = row.timing
    return {
        "backend": cache_keys.backend_record(row.backend),
        "name": row.backend.name,
        "candidate_key": candidate_key,
        "status": row.status.value,
        "reason": row.reason,
        "build_s": row.build_s,
        "max_abs_diff": _finite(row.max_abs_diff),
        "timing": None
        if timing is None
        else {
            "median_s": timing.median_s,
            "q1_s": timing.q1_s,
            "q3_s": timing.q3_s,
            "min_s": timing.min_s,
            "trials": timing.trials,
            "calls_per_trial": timing.calls_per_trial,
        },
        "batch": row.batch,
        "max_batch_size": row.max_batch_size,
        "artifact": artifact,
    }


def _finite(value: float | None) -> float | None:
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return value


def _validate(session: GraphSession, backend: Backend, runner: Runner) -> Comparison:
    with torch.no_grad():
        outputs = [runner(*s.args, **s.kwargs) for s in session.graph.samples]
    return compare_all(session.graph.outputs, outputs, backend.tolerances() or session.tolerances)


def _select(strategy: Strategy, measured: list[CandidateRow]) -> CandidateRow:
    """The strategy's pick; the first in order for strategies without a selection rule
    (first-wins: the first usable candidate)."""
    try:
        return strategy.select(measured)
    except NotImplementedError:
        return measured[0]


def _ranking(strategy: Strategy, rows: list[CandidateRow], winner: int) -> list[int]:
    """The recorded winner first, then the other measured candidates in the order the
    strategy would have picked them."""
    order = [winner]
    rest = [r for i, r in enumerate(rows) if i != winner and r.status is Status.OK and r.timing]
    while rest:
        pick = _select(strategy, rest)
        order.append(rows.index(pick))
        rest.remove(pick)
    return order


def _graph_result(
    session: GraphSession, rows: list[CandidateRow], winner: CandidateRow | None, text: str
) -> GraphResult:
    from .tune import GraphResult

    return GraphResult(session.path, session.graph, rows, winner, text)


def open_cache(cache: Any = None) -> GraphCache | None:
    """Resolve a ``cache=`` argument: None or True → the default directory
    (:func:`default_directory`), False → no cache, a path → a cache there, a
    :class:`TuningCache` (or any object with ``lookup``/``store``) → itself.

    A default directory that cannot be created only disables caching (with a warning); an
    explicit one raises :class:`~tunetree.errors.CacheError`.
    """
    if cache is False:
        return None
    if cache is None or cache is True:
        try:
            return TuningCache(default_directory())
        except CacheError as exc:
            log.warning("tuning cache disabled: %s", exc)
            return None
    if isinstance(cache, str | os.PathLike):
        return TuningCache(cache)
    if hasattr(cache, "lookup") and hasattr(cache, "store"):
        return cache  # type: ignore[no-any-return]
    raise CacheError(
        f"cache= takes a TuningCache, a directory, True/None (default directory) or False, "
        f"not {type(cache).__name__}"
    )


def device_lock(device: torch.device | str, directory: str | os.PathLike[str] | None = None):
    """The per-device profiling lock of the cache in ``directory`` (default: the default
    cache directory), as a context manager."""
    return TuningCache(directory or default_directory()).device_lock(device)
