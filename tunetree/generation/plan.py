"""Where a tuning budget goes for ``generate``: the steps that take the time, measured cheaply.

A ``generate`` call of 128 new tokens is one prefill and 127 decode steps: the decode graph is
where the time is, so it is tuned first (graphs in order of their share of eager time, from the
inspection's own count and timing of every call). Timing a depth end to end repeats whole
``generate`` calls: on a 24-layer model one pass over three prompts took 13 s, and the untuned
model's first measurement 39 s of a 150 s budget. For generation the end-to-end measurements
(which stay: they are what catches a plan that is slower as a whole) time one representative
prompt, with fewer trials; per-step latencies come from each graph's own measurement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..candidates.measure import MeasureConfig
from ..signature.binding import Binder
from ..signature.graph import Graph, Sample, flatten
from ..signature.inspection import ModelInfo
from ..signature.modules import find_module
from .steps import graph_step

END_TO_END_TRIALS = 5
"""Most timed blocks of a generation's end-to-end measurement (each block a whole generate)."""


def is_generation(info: ModelInfo, model: Any) -> bool:
    """Whether the inspected calls are generation: a module at depth 0 ran decode steps."""
    for record in info.modules.values():
        if record.depth != 0 or not record.graphs:
            continue
        module = find_module(model, record.path) if record.path else model
        names = Binder.of_module(module).names
        if any(graph_step(g, names) == "decode" for g in record.graphs.values()):
            return True
    return False


def end_to_end_samples(info: ModelInfo) -> list[Sample]:
    """The one dataset item a generation's end-to-end measurement times: the median-sized one.

    A block of the measurement is then one ``generate`` call, not one per item.
    """
    by_size = sorted(info.samples, key=_elements)
    return [by_size[(len(by_size) - 1) // 2]]


def end_to_end_config(config: MeasureConfig) -> MeasureConfig:
    """``config`` for a generation's end-to-end measurement: a few whole calls, no rematch."""
    return dataclasses.replace(
        config,
        trials=min(config.trials, END_TO_END_TRIALS),
        min_trials=min(config.min_trials, 3),
        min_warmup_calls=1,
        rematch=False,
    )


def by_time_share(todo: Sequence[tuple[str, Any, Graph]]) -> list[int]:
    """Indices of ``todo`` (path, key, graph) in the order to tune them: most eager time first.

    The inspection counted every call of each graph and its eager seconds (a decode graph of
    ``generate`` holds most of them); graphs with no timing keep their order, after the rest.
    """
    return sorted(range(len(todo)), key=lambda i: (-todo[i][2].total_s, i))


def _elements(sample: Sample) -> int:
    leaves, _ = flatten((sample.args, sample.kwargs))
    return sum(int(t.numel()) for t in leaves if hasattr(t, "numel"))
