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

The decode step that fills the window (position ``window - 1``: keys ``window - 1`` long in,
the same length out with the position carried apart) takes the branches of the steps below
the window, but no tuning prompt here makes it, so it lay outside every range and ran the
original forward for an unseen prompt that crosses the window (Gemma2's zoo family listed it
as a known fallback). The range of a sliding window's keys below the window now reaches up
to ``window - 1`` (:mod:`tunetree.signature.windows`), checked at
that end like any range's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
# Gemma2's window is 16 (the zoo's config), Mistral's 8. Tuning prompts stop short of the
# decode step that fills the window (3 new tokens: two decode steps per prompt).
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
CROSSING = {"gemma2": [(2, 14), (3, 15)], "mistral": [(2, 6), (2, 7)]}
"""Unseen prompts whose decode steps cross the window: the step at ``window - 1`` and those
around it, which no tuning prompt made."""


def generate(model: Any, settings: dict[str, Any], inputs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**inputs, **settings)


def tune(family: str) -> tt.TuneResult:
    """``family`` tuned on its tuning prompts with ONNX Runtime."""
    build, make, settings, tuning, _ = CASES[family]
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
    return result


@pytest.fixture(scope="module")
def tuned() -> Iterator[dict[str, tt.TuneResult]]:
    """Each family tuned once for this module's tests (each test checks its own fallbacks).

    A module fixture, not a process-wide cache: the results (their recorded calls) go when the
    module's tests end, as ``tests/search/test_auto.py``'s check that a served model reaches
    no recording needs (a global cache was reachable from any function's globals).
    """
    results: dict[str, tt.TuneResult] = {}
    yield results
    results.clear()


def assert_served(
    tuned: dict[str, tt.TuneResult], family: str, shapes: list[tuple[int, int]]
) -> None:
    """Unseen prompts of ``shapes``: eager's tokens, and no call ran the original forward."""
    build, make, settings, _, _ = CASES[family]
    if family not in tuned:
        tuned[family] = tune(family)
    result, eager = tuned[family], build()
    dispatcher = dispatcher_of(result.model)
    for seed, (b, n) in enumerate(shapes, start=11):
        inputs = make(b, n, seed)
        before = dispatcher.fallback_calls
        assert torch.equal(
            generate(result.model, settings, inputs), generate(eager, settings, inputs)
        )
        assert dispatcher.fallback_calls == before, f"length {n}: a call ran the original forward"


@pytest.mark.parametrize("family", list(CASES))
def test_a_prefill_range_across_the_window_serves_both_sides(
    tuned: dict[str, tt.TuneResult], family: str
) -> None:
    assert_served(tuned, family, CASES[family][4])


@pytest.mark.parametrize("family", list(CASES))
def test_an_unseen_prompt_crossing_the_window_runs_no_original_forward(
    tuned: dict[str, tt.TuneResult], family: str
) -> None:
    assert_served(tuned, family, CROSSING[family])
