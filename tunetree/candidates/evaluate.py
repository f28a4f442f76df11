"""One graph's session: its candidates built, checked against eager, and measured.

:class:`GraphSession` is what a strategy works with; its parts, one job each:
:mod:`.building` (availability, the budget's room, build; then :mod:`.checking`: outputs and
probes against eager), :mod:`.measuring` (interleaved timing, screening, rematch, per shape)
and :mod:`.decide` (which timed candidates are still in the race). The data: :mod:`.rows`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .building import MIN_BUILD_S, Building
from .decide import close_race, screen_out
from .measuring import Measuring
from .rows import CandidateRow, RunError, Status, Verdict

__all__ = [
    "MIN_BUILD_S",
    "CandidateRow",
    "GraphSession",
    "RunError",
    "Status",
    "Verdict",
    "close_race",
    "screen_out",
]


@dataclass
class GraphSession(Building, Measuring):
    """Everything a strategy needs to evaluate candidates for one graph of one module.

    Its fields are :class:`~.state.SessionState`'s; :meth:`evaluate` builds and checks one
    candidate, :meth:`measure` times the usable ones.
    """
