"""Where a fleet job can run and how many CPUs it takes there.

A job without ``"CPU"`` in its resources takes a whole node: as many CPUs as the smallest
node that offers its other resources has (all of them on a kind of identical nodes), so no
other job measures beside it. A job no alive node can run fails at once with that reason,
instead of waiting forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .job import Job


@dataclass(frozen=True)
class Placement:
    """The CPUs a job reserves, or why no node can run it."""

    cpus: float = 0.0
    problem: str | None = None


def place(job: Job, nodes: list[Mapping[str, float]]) -> Placement:
    """The job's placement among the alive nodes' total resources ``nodes``."""
    others = {k: v for k, v in job.resources.items() if k != "CPU"}
    wanted_cpus = job.resources.get("CPU")
    fitting = [
        node
        for node in nodes
        if all(node.get(name, 0.0) >= amount for name, amount in others.items())
        and node.get("CPU", 0.0) >= max(1.0, wanted_cpus or 0.0)
    ]
    if not fitting:
        wanted = {"CPU": 1.0 if wanted_cpus is None else wanted_cpus, **others}
        return Placement(problem=f"no node of the cluster offers {wanted}")
    if wanted_cpus is not None:
        return Placement(cpus=wanted_cpus)
    return Placement(cpus=min(node["CPU"] for node in fitting))
