"""Which tuned graphs are generation steps (prefill, decode), and their latencies as a table.

A call that takes a cache object (:func:`tunetree.hf.caches.contains_cache`) is a step of
generation: a *decode* step when its token input (``input_ids`` or ``decoder_input_ids``, else
the first integer matrix) holds one new position per row, a *prefill* when it holds the prompt.
The latency of a graph's winner is one call of the module; for the model's root it is close to
time to first token (prefill) and to time per new token (decode), leaving out the ``generate``
loop's own work, which the end-to-end measurement of each depth includes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from .._util.table import format_seconds, format_table
from ..backends.ranges import describe_ranges
from ..candidates.results import GraphResult
from ..signature.graph import Graph, Sample

_TOKEN_INPUTS = ("input_ids", "decoder_input_ids")


@dataclass(frozen=True)
class GenerationStep:
    """One tuned graph read as a generation step."""

    path: str
    step: str
    """``"prefill"`` or ``"decode"``."""
    ranges: str
    """The graph's dimensions (``batch 1..4, seq 16..128``), or its token input's fixed shape."""
    winner: str
    latency_s: float | None
    eager_latency_s: float | None

    @property
    def speedup(self) -> float | None:
        """Eager's latency over the winner's, when both were measured."""
        if self.latency_s and self.eager_latency_s:
            return self.eager_latency_s / self.latency_s
        return None


ParameterNames = Callable[[str], Sequence[str]]
"""The forward's parameter names (no ``self``) of the module at a path: canonical calls pass
them by position (:mod:`tunetree.signature.binding`)."""


def _tokens(sample: Sample, names: Sequence[str]) -> torch.Tensor | None:
    named = {**dict(zip(names, sample.args, strict=False)), **sample.kwargs}
    for name in _TOKEN_INPUTS:
        value = named.get(name)
        if isinstance(value, torch.Tensor):
            return value
    if names:  # the token input is known by name, and this call has none
        return None
    for value in (*sample.args, *sample.kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() == 2 and not value.is_floating_point():
            return value
    return None


def step_of(result: GraphResult, names: Sequence[str] = ()) -> str | None:
    """``"prefill"``, ``"decode"``, or None for a graph that is not a generation step.

    ``names`` are the module's forward parameters, to find the token input of a canonical
    call; without them the first integer matrix is taken for it.
    """
    return graph_step(result.graph, names)


def graph_step(graph: Graph, names: Sequence[str] = ()) -> str | None:
    """:func:`step_of` for a graph not tuned yet (the inspection's)."""
    samples = graph.samples
    if not samples or not any(sample.stateful for sample in samples):
        return None
    tokens = [_tokens(sample, names) for sample in samples]
    if any(t is None for t in tokens):
        return None
    return "decode" if all(t is not None and t.shape[-1] == 1 for t in tokens) else "prefill"


def generation_steps(
    results: Iterable[GraphResult], names: ParameterNames | None = None
) -> list[GenerationStep]:
    """The generation steps among ``results`` (prefills first, then decode steps)."""
    steps = []
    for result in results:
        parameters = names(result.path) if names is not None else ()
        step = step_of(result, parameters)
        if step is None:
            continue
        winner = result.winner if not result.never_served else None
        tokens = _tokens(result.graph.samples[0], parameters)
        fixed = f"fixed, tokens {list(tokens.shape)}" if tokens is not None else "fixed"
        steps.append(
            GenerationStep(
                path=result.path,
                step=step,
                ranges=describe_ranges(result.graph.key) or fixed,
                winner=winner.backend.name if winner is not None else _kept(result),
                latency_s=winner.latency_s if winner is not None else result.eager_latency_s,
                eager_latency_s=result.eager_latency_s,
            )
        )
    return sorted(steps, key=lambda s: (s.path, s.step != "prefill"))


def _kept(result: GraphResult) -> str:
    """The winner cell of a step that eager serves."""
    return "eager (never served)" if result.never_served else "eager (kept)"


def steps_table(steps: list[GenerationStep], title: str) -> str:
    """The steps as a readable table (empty when there are none)."""
    if not steps:
        return ""
    rows = [
        [
            s.path or "<model>",
            s.step,
            s.ranges,
            s.winner,
            format_seconds(s.latency_s) if s.latency_s else "-",
            format_seconds(s.eager_latency_s) if s.eager_latency_s else "-",
            f"{s.speedup:.2f}x" if s.speedup else "-",
        ]
        for s in steps
    ]
    return format_table(
        ["module", "step", "ranges", "winner", "latency", "eager", "speedup"], rows, title=title
    )
