"""Writing a cache entry: every candidate's row, the usable ones' artifacts, manifest last.

The entry is staged under ``tmp/``; artifacts go into content-addressed storage (each
journaled first, so gc keeps them), the manifest is written last, and the directory is
renamed into place (see :mod:`tunetree.cache.store`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from pathlib import Path

from ..backends.base import Runner
from ..candidates.evaluate import CandidateRow, GraphSession
from ..candidates.results import GraphResult
from ..runtime.artifacts import BackendRecord, FileRecord, remove_tree, save_runner
from . import keys
from .entry import ArtifactRecord, CandidateRecord, EntryManifest
from .store import JOURNAL, CacheStore

log = logging.getLogger(__name__)

KILL_HOOK_ENV = "TUNETREE_CACHE_TEST_KILL_AT"
"""Test hook: ``after-artifact``, ``before-manifest`` or ``before-rename`` makes a writer
SIGKILL itself at that step, so tests can check that a killed writer harms nothing."""

KILL_POINTS = ("after-artifact", "before-manifest", "before-rename")


def _kill_point(step: str) -> None:
    """Test hook (see :data:`KILL_HOOK_ENV`): die here, as a killed writer would."""
    if os.environ.get(KILL_HOOK_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def write_entry(
    store: CacheStore,
    session: GraphSession,
    ident: keys.EntryIdentity,
    result: GraphResult,
    reused: dict[int, ArtifactRecord],
    replace: bool = False,
) -> None:
    """Stage artifacts and the manifest (last), then rename the entry into place.

    ``reused``: artifacts of an older entry kept for these candidate indices.
    """
    rows_backends = [BackendRecord.of(r.backend).to_json() for r in result.rows]
    if rows_backends != ident.strategy["backends"]:
        log.info("tuning cache: not storing %s: not one row per candidate", ident.key[:12])
        return
    staging = store.new_temporary("entry")
    try:
        journal = staging / JOURNAL
        journal.touch()
        candidates = []
        for i, row in enumerate(result.rows):
            artifact = reused.get(i)
            if artifact is not None:
                store.keep_artifacts(artifact.files, journal)
            elif row.usable and row.runner is not None:
                artifact = _save_artifact(store, row.runner, staging / f"save-{i}", journal)
            candidates.append(_candidate_record(row, artifact, ident.candidate_keys[i]))
        manifest = _manifest(session, ident, result, candidates)
        _kill_point("before-manifest")
        store.write_manifest(staging, manifest)
        _kill_point("before-rename")
        if replace:
            store.retire(ident.key)
        hard = ident.environment.hard
        partial = manifest.partial
        published = store.publish(  # a whole race replaces one the time budget cut short
            staging,
            ident.key,
            lambda other: (
                other.schema == keys.SCHEMA
                and other.hard == hard
                and (partial or not other.partial)
            ),
        )
        if published:
            store.markers.touch_hits(ident.key)
            if session.graph.key.is_dynamic:  # only a range can cover another key
                store.markers.add_to_family(ident.family, ident.key)
    except BaseException:
        remove_tree(staging)
        raise


def _manifest(
    session: GraphSession,
    ident: keys.EntryIdentity,
    result: GraphResult,
    candidates: list[CandidateRecord],
) -> EntryManifest:
    winner = next((i for i, r in enumerate(result.rows) if r is result.winner), None)
    return EntryManifest(
        schema=keys.SCHEMA,
        key=ident.key,
        entry_id=uuid.uuid4().hex,
        created=time.time(),
        path=session.path,
        graph_text=str(session.graph.key),
        graph=ident.graph,
        module=ident.module,
        strategy=ident.strategy,
        strategy_text=result.strategy,
        tolerances=ident.tolerances,
        hard=ident.environment.hard,
        soft=ident.environment.soft,
        candidates=candidates,
        winner=winner,
        edges={
            "children": {name: d for name, d in ident.module["children"]},
            "artifacts": sorted({f.sha256 for c in candidates for f in c.files}),
        },
        family=ident.family,
        graph_key=session.graph.key.to_json(),
    )


def _save_artifact(
    store: CacheStore, runner: Runner, directory: Path, journal: Path
) -> ArtifactRecord:
    """The runner saved into a staging directory, each file moved into the artifact store."""
    directory.mkdir()
    try:
        saved = save_runner(runner, directory)
    except Exception as exc:
        log.info("tuning cache: %s runner not saved: %s", runner.backend.name, exc)
        remove_tree(directory)
        cause = exc.__cause__ or exc
        return ArtifactRecord(error=f"{type(cause).__name__}: {cause}")
    files = []
    for record in saved.files:
        sha, size = store.put_artifact(directory / record.path, journal)
        files.append(FileRecord(record.path, sha, size))
        _kill_point("after-artifact")
    remove_tree(directory)
    return ArtifactRecord(saved.description, files)


def _candidate_record(
    row: CandidateRow, artifact: ArtifactRecord | None, candidate_key: str
) -> CandidateRecord:
    return CandidateRecord(
        backend=BackendRecord.of(row.backend),
        name=row.backend.name,
        candidate_key=candidate_key,
        status=row.status,
        reason=row.reason,
        build_s=row.build_s,
        max_abs_diff=_finite(row.max_abs_diff),
        timing=row.timing,
        batch=row.batch,
        max_batch_size=row.max_batch_size,
        artifact=artifact,
    )


def _finite(value: float | None) -> float | None:
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return value
