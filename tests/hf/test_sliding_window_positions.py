"""Issue 31: a dynamic sliding-window layer's position past its window is data, not a constant.

Past its window a ``DynamicSlidingWindowLayer`` keeps ``window - 1`` positions, so no tensor
repeats how many were written, while that count sets where the attention mask starts. Keyed
by value it made every decode step past the window a graph of its own (Gemma2 generate: 12 of
its unseen steps ran the original forward). It now travels as the length of an empty tensor
(``tunetree.hf.positions``): one ranged graph serves every step past the window.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tunetree.backends.flat import FlatInputs
from tunetree.hf import CARRIER_DTYPE, ObjectState, to_data
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.graph import GraphKey, Sample, flatten, unflatten
from tunetree.signature.shapes import ranged_key
from tunetree.signature.synthetic import call_from_key
from tunetree.signature.windows import carried_floors, filled_windows, window_ceilings

transformers = pytest.importorskip("transformers")
cache_utils = pytest.importorskip("transformers.cache_utils")

WINDOW = 4


def layer_at(position: int, batch: int = 1) -> Any:
    """A dynamic sliding-window layer that has been given ``position`` positions, one by one."""
    layer = cache_utils.DynamicSlidingWindowLayer(sliding_window=WINDOW)
    for _ in range(position):
        layer.update(torch.randn(batch, 2, 1, 3), torch.randn(batch, 2, 1, 3))
    return layer


def mask_of(layer: Any) -> torch.Tensor:
    """A decode step's attention mask: one longer than the positions written."""
    return torch.ones(1, layer.cumulative_length + 1, dtype=torch.long)


def test_positions_past_the_window_share_one_pattern_and_differ_in_size_only() -> None:
    keys = [GraphKey.of((layer_at(p),), {}) for p in (WINDOW + 1, WINDOW + 6)]
    assert keys[0] != keys[1]
    assert keys[0].pattern() == keys[1].pattern()  # one graph, ranged over the position
    carriers = [s for s in keys[1].tensor_specs() if s.shape[:1] == (0,)]
    assert [c.shape for c in carriers] == [(0, WINDOW + 6)]
    # before the window fills, the keys' length says the position (no carrier)
    assert not [s for s in GraphKey.of((layer_at(2),), {}).tensor_specs() if s.shape[:1] == (0,)]


def test_a_carried_position_comes_back_as_an_int_from_flattening_and_from_a_saved_key() -> None:
    layer = layer_at(WINDOW + 3)
    leaves, spec = flatten(layer)
    carrier = next(t for t in leaves if isinstance(t, torch.Tensor) and t.dtype == CARRIER_DTYPE)
    assert carrier.shape == (0, WINDOW + 3) and carrier.numel() == 0
    back = unflatten(leaves, spec)
    assert back.cumulative_length == WINDOW + 3 and type(back.cumulative_length) is int
    state = to_data(layer)
    assert isinstance(state, ObjectState) and state.carried == ("cumulative_length",)
    made = call_from_key(GraphKey.of((layer,), {}), torch.device("cpu")).args[0]
    assert made.cumulative_length == WINDOW + 3 and type(made.cumulative_length) is int


def test_a_runner_reading_inputs_by_path_gets_the_carrier() -> None:
    layer = layer_at(WINDOW + 2)
    paths = ((("i", 0), ("i", 0), ("a", "cumulative_length")),)
    inputs = FlatInputs(paths, ("position",), (CARRIER_DTYPE,), ((0, WINDOW + 2),))
    (picked,) = inputs.pick((layer,), {})
    assert picked.dtype == CARRIER_DTYPE and tuple(picked.shape) == (0, WINDOW + 2)


def test_the_range_of_a_carried_position_reaches_down_to_the_window_with_the_mask() -> None:
    samples = [Sample((layer_at(p), mask_of(layer_at(p))), {}) for p in (9, 11, 14)]
    key = ranged_key([s.key for s in samples])
    dims = {str(d) for d in key.dims().values()}
    # the position (and the keys of no layer) reaches down to the window; the mask follows it
    assert {f"{d.name} {WINDOW}..14" for d in key.dims().values() if d.max == 14} <= dims
    assert any(d.min == WINDOW + 1 and d.max == 15 for d in key.dims().values()), dims


def mistral() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        sliding_window=WINDOW * 2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.MistralForCausalLM(config).eval()


def generate(model: Any, **inputs: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False)


def prompt(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, : length // 3] = 0
    ids = torch.randint(3, 300, (batch, length), generator=g)
    return {"input_ids": ids, "attention_mask": mask}


def test_decode_steps_past_the_window_are_one_graph_serving_unseen_positions() -> None:
    pytest.importorskip("onnxruntime")
    model = mistral()
    unseen = [prompt(2, 12, 7), prompt(2, 17, 8)]
    expected = [generate(model, **p) for p in unseen]
    result = tt.tune(
        model,
        [prompt(2, 10, 1), prompt(2, 14, 2), prompt(2, 19, 3)],
        call=generate,
        strategy=tt.HighestThroughputStrategy([tt.backends.Eager(), tt.backends.OnnxRuntime()]),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    decode = [g for g in result.graphs if g.graph.key.tensor_specs()[0].shape[-1] == 1]
    assert len(decode) == 1, result.table()  # before: a graph per position past the window
    assert decode[0].winner is not None and decode[0].winner.backend.kind == "onnxruntime"
    for p, want in zip(unseen, expected, strict=True):
        assert torch.equal(generate(result.model, **p), want)
    assert dispatcher_of(result.model).fallback_calls == 0  # every unseen step was served


def test_the_range_of_keys_below_the_window_reaches_up_to_the_step_that_fills_it() -> None:
    def below(position: int) -> Any:
        layer = cache_utils.DynamicSlidingWindowLayer(sliding_window=2 * WINDOW)
        layer.update(torch.randn(1, 2, position, 3), torch.randn(1, 2, position, 3))
        return layer

    samples = [Sample((below(p), mask_of(below(p))), {}) for p in (2, 3, 5)]
    keys = [s.key for s in samples]
    past = GraphKey.of((layer_at(WINDOW + 1),), {})  # a call past a window of 4
    assert filled_windows([*keys, past]) == {WINDOW} and not filled_windows(keys)
    key = ranged_key(keys, filled={2 * WINDOW})
    # keys and values up to window - 1 (the step that fills the window), the mask one more
    assert {str(d) for d in key.dims().values()} == {"dim 2..7", "seq 3..8"}
    # where no recorded call went past this window, or the keys were seen at two sizes only
    # (the mask's link to them is not known), nothing is raised
    unraised = ranged_key(keys, filled={WINDOW})
    assert {str(d) for d in unraised.dims().values()} == {"dim 2..5", "seq 3..6"}
    unraised = ranged_key(keys[:2], filled={2 * WINDOW})
    assert {str(d) for d in unraised.dims().values()} == {"dim 2..3", "seq 3..4"}
    # past the window (a carrier) there is no such ceiling, nor on a layer without a window
    assert not window_ceilings(past, {WINDOW})
    full = cache_utils.DynamicLayer()
    full.update(torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3))
    assert not window_ceilings(GraphKey.of((full,), {}), {WINDOW, 2 * WINDOW})


def test_a_layer_passed_by_keyword_after_a_tensor_is_found_at_its_tensor_specs_index() -> None:
    """A decoder layer's call: hidden states first, the cache by keyword. Leaves are counted
    over the args and then the kwargs, as ``tensor_specs`` orders them (the kwargs were
    counted from 0, which named the hidden states as the carrier)."""
    hidden = torch.randn(1, 1, 3)
    past = GraphKey.of((hidden,), {"past_key_values": layer_at(WINDOW + 3)})
    ((leaf, floor),) = carried_floors(past).items()
    assert floor == WINDOW and past.tensor_specs()[leaf].shape == (0, WINDOW + 3)
    below = cache_utils.DynamicSlidingWindowLayer(sliding_window=2 * WINDOW)
    below.update(torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3))
    key = GraphKey.of((hidden,), {"past_key_values": below})
    ceilings = window_ceilings(key, {2 * WINDOW})
    assert ceilings and all(key.tensor_specs()[leaf].shape == (1, 2, 5, 3) for leaf, _ in ceilings)
    assert set(ceilings.values()) == {2 * WINDOW - 1}
