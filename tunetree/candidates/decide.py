"""Which timed candidates are still in the race: the close race and the screening cut."""

from __future__ import annotations

from .rows import CandidateRow


def _per_sample(row: CandidateRow, value: float) -> float:
    """``value`` (a time per call) per sample of the row's batch."""
    return value / max(row.batch, 1)


def _timed_and_leader(rows: list[CandidateRow]) -> tuple[list[CandidateRow], CandidateRow] | None:
    """The usable timed rows and the fastest of them (per sample); None for fewer than two."""
    timed = [r for r in rows if r.usable and r.timing is not None]
    if len(timed) < 2:
        return None
    leader = min(timed, key=lambda r: _per_sample(r, r.timing.median_s))  # type: ignore[union-attr]
    return timed, leader


def close_race(rows: list[CandidateRow]) -> list[CandidateRow]:
    """The usable, timed rows whose spread (time per sample) overlaps the fastest row's.

    Empty when there is no race: fewer than two such rows. The fastest row is always among
    them otherwise.
    """
    found = _timed_and_leader(rows)
    if found is None:
        return []
    timed, best = found
    assert best.timing is not None
    limit = _per_sample(best, best.timing.q3_s)
    finalists = [r for r in timed if _per_sample(r, r.timing.q1_s) <= limit]  # type: ignore[union-attr]
    return finalists if len(finalists) >= 2 else []


def screen_out(rows: list[CandidateRow], margin: float) -> list[CandidateRow]:
    """The timed rows that cannot be within ``margin`` of the fastest one; marks them.

    A row cannot be when even its fastest quarter of blocks (per sample) is slower than the
    leader's slowest quarter by more than ``margin``: more trials would not make it the winner.
    """
    found = _timed_and_leader(rows)
    if found is None:
        return []
    timed, leader = found
    assert leader.timing is not None
    limit = _per_sample(leader, leader.timing.q3_s) * (1 + margin)
    dropped = []
    for row in timed:
        assert row.timing is not None
        if _per_sample(row, row.timing.q1_s) > limit:
            row.screened_out = True
            ratio = _per_sample(row, row.timing.median_s) / _per_sample(
                leader, leader.timing.median_s
            )
            row.reason = f"screened out: {ratio:.2f}x the leader ({leader.backend.name})"
            dropped.append(row)
    return dropped
