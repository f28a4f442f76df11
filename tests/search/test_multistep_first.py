"""On a GPU, generate's multi-step trial comes before the depths' inspection, within the budget.

Decisions only: no CUDA device is needed (what is decided reads the device's type).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tunetree as tt  # noqa: E402
from tunetree.search import auto  # noqa: E402
from tunetree.search.config import settings  # noqa: E402

CUDA = torch.device("cuda")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
    )  # fmt: skip
    return transformers.Qwen3ForCausalLM(config).eval()


def _search(**changes: Any) -> auto._DepthSearch:
    fields: dict[str, Any] = dict(
        min_depth=0, max_depth=None, tie_tolerance=0.02, budget_s=300.0, quick=False,
        accuracy=None, reuse_decision=True, savable=False,
    )  # fmt: skip
    fields.update(changes)
    return auto._DepthSearch(**fields)


GRAPHS = tt.OneBackendStrategy(tt.backends.DeviceGraph())


def test_on_a_gpu_the_loop_trial_comes_before_the_depths_are_inspected() -> None:
    # Recording every module's calls of long generate calls costs many passes' time; the
    # loop needs the root's calls only, so only the root is inspected before it.
    assert auto._whole_first(_model(), settings(None), _search(), GRAPHS, CUDA)


@pytest.mark.parametrize(
    ("changes", "strategy"),
    [
        ({"min_depth": 1}, GRAPHS),
        ({"savable": True}, GRAPHS),
        ({}, tt.OneBackendStrategy(tt.backends.Eager())),  # no device graphs asked for
    ],
)
def test_the_depths_are_inspected_first_where_the_loop_is_not_tried(
    changes: dict, strategy: tt.Strategy
) -> None:
    assert not auto._whole_first(_model(), settings(None), _search(**changes), strategy, CUDA)


def test_the_loop_applies_to_a_decoder_on_a_cuda_device_only() -> None:
    from tunetree.search.multistep_first import applies

    assert applies(_model(), ["device-graph"], CUDA)
    assert not applies(_model(), ["device-graph"], torch.device("cpu"))
    assert not applies(torch.nn.Linear(2, 2), ["device-graph"], CUDA)


def test_after_the_trial_the_depths_are_inspected_only_when_their_inspection_fits() -> None:
    # One root pass took 10 s: on a GPU the deeper inspection is expected to take many.
    assert auto._inspection_s(10.0, CUDA) == 10.0 * auto.GPU_INSPECTION_PASSES
    assert auto._inspection_s(10.0, torch.device("cpu")) == 10.0
