"""What a candidate's build is expected to cost, and which candidates to build first.

A time budget is spent best on the candidates most likely to win per second of building.
:class:`BuildCosts` keeps, for one tune, every build's time by backend kind and graph size
(the number of modules the built module holds: compile and export times grow with the
operations traced, not with the tensors' sizes) and which kinds won the graphs tuned so far.
From these it expects a build's time and orders the candidates of the next graph: cheapest
per chance of winning first.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

FIXED_SHARE = 0.3
"""The share of a build's time that does not grow with the graph's size (imports, session
set-up, a compiler's start). A build of a graph ``k`` times larger is expected to take
``FIXED_SHARE + (1 - FIXED_SHARE) * k`` times as long."""

STOPPED_FACTOR = 2.0
"""A build the budget stopped is expected to have needed at least this many times as long."""

REFERENCE_SIZE = 30
"""The graph size (modules) a backend's ``typical_build_s`` is given for: a small two-layer
transformer."""


def module_size(module: Any) -> int:
    """A graph's size as build times grow with it: the modules its module holds."""
    return sum(1 for _ in module.modules())


def scaled(seconds: float, from_size: int, to_size: int) -> float:
    """``seconds`` of a build of a graph of ``from_size`` modules, scaled to ``to_size``."""
    ratio = max(to_size, 1) / max(from_size, 1)
    return seconds * (FIXED_SHARE + (1.0 - FIXED_SHARE) * ratio)


@dataclass
class BuildCosts:
    """Builds seen in one tune, by backend kind, and races won (see the module docstring).

    ``priors`` give each kind's typical build time at :data:`REFERENCE_SIZE` (a backend's
    ``typical_build_s``): they decide until a kind has been built once, scaled by how much
    slower or faster this machine built the kinds it has built than their priors said.
    """

    seen: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """(graph size, seconds) of every build, per kind."""
    completed: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """The builds that produced a runner: only these say how fast this machine builds. A
    failure can end in a fraction of a build, and a build the budget stopped says only that
    its own backend takes at least that long here (one that hung would make every other
    backend look as slow)."""
    priors: dict[str, float] = field(default_factory=dict)
    races: Counter[str] = field(default_factory=Counter)
    """Graphs where the kind was built and correct (it took part in the race)."""
    wins: Counter[str] = field(default_factory=Counter)

    def record(
        self,
        kind: str,
        size: int,
        seconds: float,
        prior_s: float | None = None,
        completed: bool = True,
        stopped: bool = False,
    ) -> None:
        """One build of ``kind`` on a graph of ``size`` modules took ``seconds``.

        ``completed``: it produced a runner (it did not fail and was not stopped). ``stopped``:
        the budget stopped it, so it would have taken longer: it counts as
        :data:`STOPPED_FACTOR` times ``seconds``.
        """
        if stopped:
            seconds *= STOPPED_FACTOR
        self.seen.setdefault(kind, []).append((size, seconds))
        if completed:
            self.completed.setdefault(kind, []).append((size, seconds))
        if prior_s is not None:
            self.priors.setdefault(kind, prior_s)

    def record_race(self, raced: list[str], winner: str | None) -> None:
        """The kinds that were correct on one graph, and the one that won it (or none)."""
        self.races.update(set(raced))
        if winner is not None:
            self.wins[winner] += 1

    def machine_factor(self) -> float:
        """How much longer this machine's builds took than their kinds' priors said (median)."""
        ratios = sorted(
            seconds / scaled(self.priors[kind], REFERENCE_SIZE, size)
            for kind, builds in self.completed.items()
            if self.priors.get(kind, 0.0) > 0
            for size, seconds in builds
        )
        if not ratios:
            return 1.0
        return ratios[len(ratios) // 2]

    def expected_s(self, kind: str, size: int, prior_s: float | None = None) -> float:
        """How long a build of ``kind`` on a graph of ``size`` modules is expected to take.

        From the kind's build on the graph nearest in size, scaled to ``size``; for a kind not
        built yet, from its prior (``prior_s``, else the longest build seen), scaled by
        :meth:`machine_factor`.
        """
        builds = self.seen.get(kind)
        if builds:
            near_size, seconds = min(
                builds, key=lambda b: (abs(math.log(max(b[0], 1) / max(size, 1))), -b[1])
            )
            return scaled(seconds, near_size, size)
        prior = prior_s if prior_s is not None else self.priors.get(kind)
        if prior is None:
            return max((s for builds in self.seen.values() for _, s in builds), default=0.0)
        return scaled(prior, REFERENCE_SIZE, size) * self.machine_factor()

    def win_chance(self, kind: str) -> float:
        """The chance ``kind`` wins a graph it is correct on, from this tune's races so far.

        Laplace's rule, ``(wins + 1) / (races + 2)``: one half before any race.
        """
        return (self.wins[kind] + 1) / (self.races[kind] + 2)

    def cost_per_win(self, kind: str, size: int, prior_s: float | None = None) -> float:
        """Expected build seconds per expected win: the order in which to build."""
        return self.expected_s(kind, size, prior_s) / self.win_chance(kind)
