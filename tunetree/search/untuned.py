"""Why an :func:`~tunetree.auto_tune` left the model untuned, in one line.

A caller that keeps only the outcome (a fleet row, a log line) still needs the reason: the time
budget spent before a candidate was built, no candidate able to run here, every depth slower
than the untuned model, a build or an end-to-end check that failed. The depth rows hold it;
this says it without the table.
"""

from __future__ import annotations

from .auto_result import AutoTuneResult, DepthRow, DepthStatus

NO_GAIN = "no depth beat the untuned model"


def why_untuned(result: AutoTuneResult) -> str:
    """Why ``result`` kept the untuned model ("" when it serves a tuned one).

    Args:
        result: What :func:`~tunetree.auto_tune` returned.

    Returns:
        One line: the reason shared by every depth, or each depth's outcome in turn.
    """
    if result.depth is not None or any(t.chosen for t in result.stateful):
        return ""
    if result.dry_run:
        return "dry run: nothing was tuned"
    rows = [r for r in result.rows if r.status is not DepthStatus.NOT_STARTED] or result.rows
    if not rows:
        return "no depth to tune"
    shared = {(r.status, r.error) for r in rows if r.same_as is None}
    if len(shared) == 1 and all(r.speedup is None for r in rows):
        (status, error), *_ = shared
        return f"every depth: {status}" + (f": {error}" if error else "")
    return f"{NO_GAIN}: " + "; ".join(_depth(r) for r in rows)


def _depth(row: DepthRow) -> str:
    speedup = f"{row.speedup:.2f}x, " if row.speedup is not None and row.same_as is None else ""
    return f"depth {row.depth}: {speedup}{row.status_text}"
