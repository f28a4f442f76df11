"""Serving a lookup from a recorded entry: rows back, recorded runners loaded and checked.

Only the candidates needed are loaded (the winner, or the next recorded candidate when the
winner no longer loads), each rebuilt from its artifacts with the strategy's own backend
object and checked exactly like a fresh build before use: against eager on the current
samples and on the graph's probes (value probes, range ends). An entry is hostile until
checked: its artifacts may have been rewritten and its manifest resealed.
"""

from __future__ import annotations

import contextlib
import logging

from ..backends.base import Backend, Runner
from ..backends.known_outputs import outputs_known
from ..candidates.evaluate import CandidateRow, GraphSession, RunError, Status
from ..candidates.strategy import Strategy
from ..errors import BackendError
from ..runtime.artifacts import (
    SavedRunner,
    allowed_elements,
    load_runner,
    parameter_bytes,
    remove_tree,
    remove_with,
)
from ..signature.compare import Comparison
from .entry import CandidateRecord, EntryFault, EntryManifest
from .store import CacheStore

log = logging.getLogger(__name__)


class Unusable(Exception):
    """The entry cannot serve this lookup; the graph is tuned again.

    ``mark``: whether the entry itself is at fault (then it is marked invalid).
    """

    def __init__(self, reason: str, mark: bool = True) -> None:
        super().__init__(reason)
        self.mark = mark


def recorded_rows(strategy: Strategy, manifest: EntryManifest) -> list[CandidateRow]:
    """The recorded candidate rows, with the strategy's own backend objects."""
    return [
        CandidateRow(
            backend,
            record.status,
            record.reason,
            record.build_s,
            record.max_abs_diff,
            record.timing,
            record.batch,
            record.max_batch_size,
        )
        for backend, record in zip(strategy.backends, manifest.candidates, strict=True)
    ]


def load_candidate(
    store: CacheStore, session: GraphSession, row: CandidateRow, record: CandidateRecord
) -> Runner | None:
    """The candidate's runner rebuilt from its artifacts and checked against eager.

    None when it cannot be loaded (the row becomes a failure). Raises for corrupted artifacts (the
    whole entry is invalid) and :class:`Unusable` for outputs that differ from eager.
    """
    artifact = record.artifact
    if artifact is None or not artifact.saved:
        row.status, row.reason = Status.FAILED, "cache: its runner was not saved"
        return None
    try:
        directory = store.materialize(artifact.files)
    except EntryFault:
        raise
    except OSError as exc:  # the local cache cannot stage files (tmp/ read-only, disk full)
        raise Unusable(f"the local cache cannot stage its files: {exc}", mark=False) from exc
    saved = SavedRunner(record.backend, artifact.description or {}, artifact.files)
    stored = sum(f.size for f in artifact.files) + parameter_bytes(session.module)
    try:
        key = session.graph.key
        outputs = session.graph.outputs
        with outputs_known(key, outputs[0]) if outputs else contextlib.nullcontext():
            runner = load_runner(
                saved,
                session.module,
                key,
                directory,
                session.device,
                row.backend,
                max_elements=allowed_elements(stored),
            )
        if runner.served is not None and not runner.served.covers(key):
            raise BackendError(f"its artifact serves {runner.served} only, not {key}")
        comparison, error = _validate(session, row.backend, runner)
    except Exception as exc:
        remove_tree(directory)
        log.info("tuning cache: %s could not be loaded: %s", row.backend.name, exc)
        row.status, row.reason = Status.FAILED, f"cache: load: {type(exc).__name__}: {exc}"
        row.timing = None
        return None
    if not comparison.ok:
        remove_tree(directory)
        raise Unusable(f"{row.backend.name} no longer matches eager: {comparison.reason}")
    wrong = _probe_failure(session, runner)
    if wrong is not None:
        remove_tree(directory)
        raise Unusable(f"{row.backend.name} does not match eager on probes: {wrong}")
    # The files live as long as the runner (a backend may read them lazily).
    remove_with(runner, directory)
    row.max_abs_diff, row.error = comparison.max_abs_diff, error
    return runner


def _validate(
    session: GraphSession, backend: Backend, runner: Runner
) -> tuple[Comparison, float | None]:
    """The loaded runner judged on the graph's samples, as a fresh build would be.

    Returns the comparison and the error in an accuracy budget's module metric (None without).
    """
    try:
        reason, max_diff, error = session.run_judged(backend, runner)
    except RunError as exc:
        raise exc.cause from exc
    return Comparison(not reason, max_diff, reason), error


def _probe_failure(session: GraphSession, runner: Runner) -> str | None:
    """Why the loaded runner is wrong on the graph's probes, as a fresh build is checked.

    The recorded samples alone cannot show weights changed in directions they do not span
    (a rank-one change in the null space of the recorded inputs passes them exactly); the
    value probes (other values, same shapes) and, for a ranged graph, the range ends do.
    Eager's outputs on the probes are computed once per graph and shared with any build.
    """
    try:
        return session.probe_failure(runner)
    except Exception as exc:  # a probe that breaks the check refuses the entry
        return f"{type(exc).__name__}: {exc}"


def select(strategy: Strategy, measured: list[CandidateRow]) -> CandidateRow:
    """The strategy's pick.

    The first in order for strategies without a selection rule (first-wins: the first usable
    candidate).
    """
    try:
        return strategy.select(measured)
    except NotImplementedError:
        return measured[0]


def ranking(strategy: Strategy, rows: list[CandidateRow], winner: int) -> list[int]:
    """The recorded winner first, then the other measured candidates.

    The others come in the order the strategy would have picked them.
    """
    order = [winner]
    rest = [r for i, r in enumerate(rows) if i != winner and r.status is Status.OK and r.timing]
    while rest:
        pick = select(strategy, rest)
        order.append(rows.index(pick))
        rest.remove(pick)
    return order
