"""Generation steps in results (issue 21): a tuned ``generate`` says which graphs are prefill
calls and which are decode steps, with their winners' latencies beside eager's."""

from __future__ import annotations

import pytest
import torch

import tunetree as tt
from tests.hf.test_generate import PROMPTS, generate, gpt2
from tunetree.generation import generation_steps

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def gpt2_auto() -> tt.AutoTuneResult:
    return tt.auto_tune(
        gpt2(),
        PROMPTS,
        call=generate,
        max_depth=0,
        strategy=tt.HighestThroughputStrategy([tt.backends.OnnxRuntime(), tt.backends.Eager()]),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )


def test_gpt2_graphs_read_as_one_prefill_and_one_decode_step(
    gpt2_auto: tt.AutoTuneResult,
) -> None:
    steps = generation_steps(gpt2_auto.graphs[0])  # by the first integer matrix, without names
    assert [s.step for s in steps] == ["prefill", "decode"], gpt2_auto
    prefill, decode = steps
    assert "batch 2..3" in prefill.ranges and "seq" in prefill.ranges
    assert "batch 2..3" in decode.ranges
    for step in steps:
        assert step.winner == "onnxruntime"
        assert step.latency_s and step.eager_latency_s and step.speedup
        assert step.speedup == pytest.approx(step.eager_latency_s / step.latency_s)


def test_a_model_without_caches_has_no_steps() -> None:
    model = torch.nn.Linear(4, 4).eval()
    result = tt.tune(
        model,
        [torch.randn(2, 4)],
        strategy=tt.OneBackendStrategy(tt.backends.Eager()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    assert generation_steps(result.graphs) == []


def test_auto_tune_prints_the_generation_steps_of_the_selected_depth(
    gpt2_auto: tt.AutoTuneResult,
) -> None:
    result = gpt2_auto
    if result.depth is None:  # nothing beat eager end to end here: no steps to show
        assert result.generation_steps() == []
        return
    text = str(result)
    assert "generation steps at depth 0" in text
    assert [s.step for s in result.generation_steps()] == ["prefill", "decode"]
    assert "prefill" in text and "decode" in text
