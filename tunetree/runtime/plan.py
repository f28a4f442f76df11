"""The plan: which runner serves which graph of which module path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..backends.base import Backend, Runner
from ..signature.graph import GraphKey


@dataclass
class PlanEntry:
    """The chosen runner for one graph of one module."""

    path: str
    key: GraphKey
    backend: Backend
    runner: Runner = field(repr=False)
    latency_s: float | None = None
    eager_latency_s: float | None = None


@dataclass
class Plan:
    """Every chosen runner of a tuned model, and the cut depth it came from."""

    entries: list[PlanEntry] = field(default_factory=list)
    depth: int | None = None
    accuracy: dict[str, Any] | None = None
    """Under an accuracy budget: the budget and the plan's measured error (JSON data)."""
    unserved: dict[tuple[str, GraphKey], str] = field(default_factory=dict)
    """Graphs recorded while tuning that no entry serves, by (path, key), with why: a call of
    one says that, not that its signature was never seen."""

    def unserved_graph(self, path: str, key: GraphKey) -> tuple[GraphKey, str] | None:
        """The tuned graph of ``path`` that a call keyed ``key`` is in, when no runner serves it.

        Returns its key and why no runner serves it; None when ``key`` is in no such graph (it
        was not seen while tuning).
        """
        for (where, tuned), reason in self.unserved.items():
            if where != path:
                continue
            if tuned == key or (
                tuned.is_dynamic and tuned.pattern() == key.pattern() and tuned.accepts(key)
            ):
                return tuned, reason
        return None

    def runners(self) -> dict[str, dict[GraphKey, Runner]]:
        """Runners to install, by path.

        Paths whose every graph chose eager are left out: they keep their original forward with no
        dispatch cost.
        """
        by_path: dict[str, dict[GraphKey, Runner]] = {}
        for entry in self.entries:
            by_path.setdefault(entry.path, {})[entry.key] = entry.runner
        return {
            path: runners
            for path, runners in by_path.items()
            if any(r.backend.kind != "eager" for r in runners.values())
        }

    def to_json(self) -> list[dict[str, Any]]:
        """JSON rows: path, graph, backend, latency."""
        return [
            {
                "path": e.path,
                "graph": str(e.key),
                "backend": e.backend.name,
                "latency_s": e.latency_s,
                "eager_latency_s": e.eager_latency_s,
            }
            for e in self.entries
        ]

    def signature(self) -> frozenset[tuple[str, GraphKey, int]]:
        """What the plan installs: (path, graph key, runner) of :meth:`runners`.

        Two plans with one signature wrap the model into the same code.
        """
        return frozenset(
            (path, key, id(runner))
            for path, runners in self.runners().items()
            for key, runner in runners.items()
        )

    def replaced(self, path: str, key: GraphKey, entry: PlanEntry | None) -> Plan:
        """A copy with the entry of ``(path, key)`` replaced by ``entry`` (removed for None).

        A removed entry's graph keeps the module's original forward.
        """
        entries = []
        for e in self.entries:
            if (e.path, e.key) != (path, key):
                entries.append(e)
            elif entry is not None:
                entries.append(entry)
        unserved = dict(self.unserved)
        if entry is None:
            unserved[(path, key)] = "given back to the module's forward by the accuracy budget"
        return Plan(entries, self.depth, unserved=unserved)

    def changes_results(self) -> bool:
        """Whether any entry's backend changes results (an opt-in, reduced-precision one)."""
        return any(not e.backend.preserves_results for e in self.entries)
