"""Why a cut kept eager everywhere, in one line a depth's row can show.

Each candidate's row says why it was not used; a depth that gained nothing needs the gist of those
rows, per backend, not only the first reason met.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .evaluate import CandidateRow, Status
from .results import GraphResult


def why_no_gain(results: Sequence[GraphResult], limit: int = 200) -> str:
    """Why no candidate besides eager serves the graphs of ``results``, per backend.

    Each backend's most common outcome over the graphs it was tried on, such as ``openvino: 3 of
    3 graphs failed: build: ...`` or ``onnxruntime: ok on 2 of 3 graphs, not faster than eager``.
    Eager is named only where its own row is not usable (it is the reference: its row fails when
    the model's outputs change from one call to the next).

    Args:
        results: The graphs of one cut.
        limit: Most characters of each reason shown.

    Returns:
        One line (empty without rows).
    """
    tried: dict[str, list[CandidateRow]] = {}
    for result in results:
        for row in result.rows:
            tried.setdefault(row.backend.name, []).append(row)
    parts = []
    for name, rows in tried.items():
        text = _outcome(rows, limit)
        eager = rows[0].backend.kind == "eager"
        if text and not (eager and text.startswith("ok")):
            parts.append(f"{name}: {text}")
    return "; ".join(parts)


def _outcome(rows: list[CandidateRow], limit: int) -> str:
    """One backend's outcome over its rows: the most common failure, and how many were ok."""
    usable = sum(1 for row in rows if row.status is Status.OK)
    others = Counter(_cut(row.describe(), limit) for row in rows if row.status is not Status.OK)
    parts = []
    if others:
        outcome, count = others.most_common(1)[0]
        parts.append(f"{count} of {len(rows)} graphs {outcome}")
        rest = sum(others.values()) - count
        if rest:
            parts[-1] += f" (and {rest} {'graph' if rest == 1 else 'graphs'} with another reason)"
    if usable:
        parts.append(f"ok on {usable} of {len(rows)} graphs, not faster than eager")
    return "; ".join(parts)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
