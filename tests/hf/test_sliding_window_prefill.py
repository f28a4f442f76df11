"""A prefill whose length range spans a sliding window is served on both sides of the window.

Below the window a dynamic sliding-window layer keeps every position, so its position
(``cumulative_length``) is the keys' length; past it the layer keeps ``window - 1`` and the
position travels as a carrier tensor (:mod:`tunetree.hf.positions`). One prefill graph ranged
over both sides was exported at one example (past the window: one more tensor per layer) while
its output record came from the first sample (below it), so every tensor after the first layer
came back in the wrong place: the runner's ``cumulative_length`` read 0 where eager's was 8, the
graph was rejected and every prefill ran the original forward. A flat graph's outputs now carry
every such position on both sides (:func:`tunetree.hf.positions.carrying_positions`).

Each case tunes ``generate`` with ONNX Runtime alone on prompts below and past the window, then
generates unseen prompt lengths on both sides: eager's tokens, and every call served by a
runner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.hf.test_generation_round_trip import GREEDY, mistral, prompt
from tests.models.hf_zoo import FAMILIES as ZOO
from tunetree.runtime.wrap import dispatcher_of

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")


def gemma2_prompt(batch: int, length: int, seed: int) -> dict[str, Any]:
    return dict(ZOO["gemma2-generate"].call(batch, length, seed))


GEMMA2_SETTINGS = {**(ZOO["gemma2-generate"].generate or {}), **GREEDY}

# name: (build, make a prompt, settings, tuning (batch, length), unseen (batch, length))
# Gemma2's window is 16 (the zoo's config), Mistral's 8. Prompts stop short of the decode
# step that fills the window, whose graph is another matter.
CASES: dict[str, tuple[Callable[[], nn.Module], Callable[..., Any], dict[str, Any], Any, Any]] = {
    "gemma2": (
        ZOO["gemma2-generate"].build,
        gemma2_prompt,
        GEMMA2_SETTINGS,
        [(2, 8), (3, 12), (2, 20), (3, 32)],
        [(2, 10), (3, 26)],
    ),
    "mistral": (mistral, prompt, GREEDY, [(2, 3), (2, 5), (2, 10), (2, 14)], [(2, 4), (2, 12)]),
}


def generate(model: Any, settings: dict[str, Any], inputs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**inputs, **settings)


@pytest.mark.parametrize("family", list(CASES))
def test_a_prefill_range_across_the_window_serves_both_sides(family: str) -> None:
    build, make, settings, tuning, unseen = CASES[family]
    prompts = [make(b, n, seed) for seed, (b, n) in enumerate(tuning)]
    result = tt.tune(
        build(),
        prompts,
        call=lambda model, **inputs: generate(model, settings, inputs),
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    assert all(g.winner is not None for g in result.graphs), result.table()
    eager = build()
    dispatcher = dispatcher_of(result.model)
    for seed, (b, n) in enumerate(unseen, start=11):
        inputs = make(b, n, seed)
        before = dispatcher.fallback_calls
        assert torch.equal(
            generate(result.model, settings, inputs), generate(eager, settings, inputs)
        )
        assert dispatcher.fallback_calls == before, f"length {n}: a call ran the original forward"
