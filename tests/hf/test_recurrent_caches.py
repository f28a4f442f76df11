"""Issue 31, item 4: state-space and hybrid models' caches are data like ``DynamicCache``.

transformers 5 keeps Mamba's conv and SSM states in ``LinearAttentionLayer`` s of a
``DynamicCache`` (hybrids mix them with key/value layers and ``DummyLayer`` s). They were not
recognised as caches: a decode step's key said ``DynamicCache(0 tensors)``, the state was
left out, and even eager was rejected ("output structure differs at output.cache").
"""

from __future__ import annotations

import re

import pytest
import torch

import tunetree as tt
from tests.fakes import Delayed
from tunetree.candidates.evaluate import Status
from tunetree.hf import is_cache_object
from tunetree.signature.compare import compare
from tunetree.signature.graph import GraphKey, detach_clone, flatten

transformers = pytest.importorskip("transformers")
cache_utils = pytest.importorskip("transformers.cache_utils")

GEN = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}


def mamba() -> torch.nn.Module:
    config = transformers.MambaConfig(
        vocab_size=256,
        hidden_size=16,
        state_size=4,
        num_hidden_layers=2,
        conv_kernel=4,
        expand=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return transformers.MambaForCausalLM(config).eval()


def prompt(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(4, 250, (batch, length), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def generate(model: torch.nn.Module, **kwargs: torch.Tensor) -> torch.Tensor:
    return model.generate(**kwargs, **GEN)


def test_recurrent_and_hybrid_layer_classes_are_cache_objects() -> None:
    assert is_cache_object(cache_utils.LinearAttentionLayer())
    assert is_cache_object(cache_utils.LinearAttentionAndFullAttentionLayer())
    assert is_cache_object(cache_utils.DummyLayer())


def test_a_mamba_cache_is_keyed_cloned_and_compared_by_its_states() -> None:
    model = mamba()
    with torch.no_grad():
        out = model(**prompt(2, 6, 0), use_cache=True)
    cache = out.past_key_values
    leaves, _ = flatten(cache)
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    states = [t for t in tensors if t.is_floating_point()]
    assert len(states) == 4  # a conv and an SSM state per layer
    # transformers 5.25 adds a 0-d token counter per layer (``cumulative_length_linear``):
    # it is data too, so the key counts every tensor the cache holds.
    key = GraphKey.of((cache,), {})
    assert f"DynamicCache({len(tensors)} tensors" in str(key)
    twin = detach_clone(cache)
    assert compare(cache, twin).ok
    twin.layers[1].recurrent_states[0] += 1.0
    result = compare(cache, twin)
    assert not result.ok and "recurrent_states" in result.reason


@pytest.mark.slow
def test_mamba_generate_tunes_with_identical_tokens() -> None:
    model = mamba()
    data = [prompt(1, 6, 0), prompt(2, 10, 1)]
    result = tt.auto_tune(
        model,
        data,
        call=generate,
        max_depth=0,
        # Every graph runs the fake: with eager beside it the winner was a coin toss, and an
        # all-eager depth has no plan for use() to serve.
        strategy=tt.OneBackendStrategy(Delayed()),
        measure_config=tt.MeasureConfig.quick(),
        time_budget=None,
        cache=False,
        verbose=False,
    )
    graphs = result.graphs[0]
    # The decode step's cache holds the float states (the prefill's holds at most counters).
    decode = [g for g in graphs if re.search(r"DynamicCache\(\d+ tensors: f32", str(g.graph.key))]
    assert decode, [str(g.graph.key) for g in graphs]
    for graph in graphs:
        assert all(r.status is Status.OK for r in graph.rows), graph.rows
    result.use(0)
    unseen = prompt(2, 8, 5)
    with torch.no_grad():
        assert torch.equal(generate(result.model, **unseen), generate(model, **unseen))
