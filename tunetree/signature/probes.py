"""Calls a candidate is checked on besides the recorded ones, with eager's outputs.

A ranged graph is checked at its ranges' ends and an odd size in between (samples resized
from the largest recorded one), so a runner is never accepted for sizes it was not shown to
get right. Every graph is also checked on value probes (the same shapes, other values): a
runner that baked one branch of ``if x.sum() > 0`` into its graph answers one differently.
Eager's outputs are computed once per graph with the module's original forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .binding import original_forward
from .graph import Graph, Sample, flatten
from .parking import Homes, all_moved, park, unpark
from .shapes import keep_links, largest, linked_dims, probe_sizes, resize, value_probes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Probe:
    """One probe call of a graph: its label, its arguments and eager's output, on their devices.

    Taken from host memory piece by piece, so that what a check holds on the device at once is
    the call and one output (a decode step's probe and eager's output each hold a whole cache).
    """

    label: str
    """Names the probe (``probe batch=1, seq=7``, ``value probe``)."""
    sample: Sample
    """The call, its tensors on their devices."""
    private: bool
    """Whether ``sample``'s tensors are copies made for this use alone (they were brought back
    from host memory): a run may then mutate them, and :meth:`run` makes no other copy."""
    _expected: Any
    _expected_homes: Homes | None

    def run(self, fn: Callable[..., Any]) -> Any:
        """``fn`` called with the probe's arguments (a copy of their state where needed)."""
        if self.private:
            return fn(*self.sample.args, **self.sample.kwargs)
        return self.sample.run(fn)

    def expected(self) -> Any:
        """Eager's output of the probe, on the device it was computed on (a copy when parked)."""
        return unpark(self._expected, self._expected_homes)


def checks(module: nn.Module, graph: Graph) -> Iterator[Probe]:
    """The probe calls of ``graph`` with eager's outputs, one at a time on their devices.

    They are computed once and kept on the graph, each parked in host memory
    (:mod:`tunetree.signature.parking`) and copied back to its device when it is used: a decode
    step's probes and eager's outputs each hold a whole cache, and kept on the device for every
    graph they were a large part of tuning's peak device memory. Eager's output comes back only
    when :meth:`Probe.expected` asks for it, after the candidate ran.
    """
    if graph.checks is None:
        graph.checks = _build(module, graph)
    for label, (inputs, input_homes), (expected, expected_homes) in graph.checks:
        args, kwargs = unpark(inputs, input_homes)
        private = input_homes is not None and all_moved(inputs, input_homes)
        yield Probe(label, Sample(args, kwargs), private, expected, expected_homes)


Parked = tuple[Any, "Homes | None"]
"""A tree parked in host memory and where its tensors go back (see :func:`park`)."""


def _build(module: nn.Module, graph: Graph) -> list[tuple[str, Parked, Parked]]:
    """Each probe as (label, its arguments parked, eager's output parked)."""
    forward = original_forward(module)
    found: list[tuple[str, Parked, Parked]] = []

    def keep(label: str, sample: Sample, output: Any) -> None:
        found.append((label, park((sample.args, sample.kwargs)), park(output)))

    if graph.key.is_dynamic:
        base = largest(graph.samples)
        linked = linked_dims(graph.samples, graph.key)
        for sizes in keep_links(probe_sizes(graph.key), graph.key, linked):
            label = "probe " + ", ".join(f"{n}={v}" for n, v in sorted(sizes.items()))
            sample = resize(base, graph.key, sizes)
            output = _eager(forward, sample, label)
            if output is not None:
                keep(label, sample, output)
    recorded_finite = _finite(graph.outputs[0])  # parked or not: same values
    for sample in value_probes(graph.samples[0]):
        output = _eager(forward, sample, "value probe")
        if output is not None and (_finite(output) or not recorded_finite):
            keep("value probe", sample, output)
    return found


def _eager(forward: Any, sample: Any, label: str) -> Any:
    """Eager's output on a probe, or None when eager itself cannot run it (not a valid input)."""
    try:
        with torch.no_grad():
            return sample.run(forward)
    except Exception as exc:
        log.debug("eager cannot run %s (%s): skipped", label, exc)
        return None


def _finite(tree: Any) -> bool:
    leaves, _ = flatten(tree)
    return all(
        bool(torch.isfinite(t).all())
        for t in leaves
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    )
