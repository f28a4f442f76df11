"""Calls a candidate is checked on besides the recorded ones, with eager's outputs.

A ranged graph is checked at its ranges' ends and an odd size in between (samples resized
from the largest recorded one), so a runner is never accepted for sizes it was not shown to
get right. Every graph is also checked on value probes (the same shapes, other values): a
runner that baked one branch of ``if x.sum() > 0`` into its graph answers one differently.
Eager's outputs are computed once per graph with the module's original forward.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from .binding import original_forward
from .graph import Graph, flatten
from .shapes import keep_links, largest, linked_dims, probe_sizes, resize, value_probes

log = logging.getLogger(__name__)

Check = tuple[str, Any, Any]
"""(label naming the probe, :class:`~tunetree.signature.graph.Sample`, eager's output on it)."""


def checks(module: nn.Module, graph: Graph) -> list[Check]:
    """The probe calls of ``graph`` with eager's outputs (computed once, kept on the graph)."""
    if graph.checks is None:
        graph.checks = _build(module, graph)
    return graph.checks


def _build(module: nn.Module, graph: Graph) -> list[Check]:
    forward = original_forward(module)
    found: list[Check] = []
    if graph.key.is_dynamic:
        base = largest(graph.samples)
        linked = linked_dims(graph.samples, graph.key)
        for sizes in keep_links(probe_sizes(graph.key), graph.key, linked):
            label = "probe " + ", ".join(f"{n}={v}" for n, v in sorted(sizes.items()))
            sample = resize(base, graph.key, sizes)
            output = _eager(forward, sample, label)
            if output is not None:
                found.append((label, sample, output))
    for sample in value_probes(graph.samples[0]):
        output = _eager(forward, sample, "value probe")
        if output is not None and (_finite(output) or not _finite(graph.outputs[0])):
            found.append(("value probe", sample, output))
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
