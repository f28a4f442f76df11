"""Autoregressive generation: telling prefill calls from decode steps, and reporting them.

Tuning ``generate`` needs nothing of its own beyond :mod:`tunetree.hf` (caches are data) and
the decode runners of :mod:`tunetree.backends`; this package reads tuned graphs as generation
steps, so that a result says what a prefill and a decode step cost.
"""

from __future__ import annotations

from .plan import by_time_share, end_to_end_config, end_to_end_samples, is_generation
from .steps import GenerationStep, generation_steps, graph_step, step_of, steps_table

__all__ = [
    "GenerationStep",
    "by_time_share",
    "end_to_end_config",
    "end_to_end_samples",
    "generation_steps",
    "graph_step",
    "is_generation",
    "step_of",
    "steps_table",
]
