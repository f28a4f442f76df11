"""A cache whose tensors a runtime holds: its length without reading, its tensors on first use."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import (  # noqa: E402
    DYNAMIC_LAYER_TYPE_MAPPING,
    DynamicCache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
)

from tunetree.generation.held_cache import Holder, held_class, held_state_of, hold  # noqa: E402


def _reader(tensors: list[torch.Tensor], calls: list[int]):
    def read() -> list[torch.Tensor]:
        calls.append(1)
        return [t.clone() for t in tensors]

    return read


def test_length_is_answered_without_reading_and_tensors_on_first_use() -> None:
    cache = DynamicCache()
    cache.layers = [DynamicLayer(), DynamicLayer()]
    tensors = [torch.randn(2, 3, 5, 4) for _ in range(4)]
    calls: list[int] = []
    hold(cache, 5, _reader(tensors, calls), torch.float32)
    assert cache.get_seq_length() == 5
    assert calls == []  # the loop's question costs nothing
    assert held_state_of(cache) is not None
    assert torch.equal(cache.layers[1].values, tensors[3])
    assert calls == [1]  # every layer filled by one read
    assert torch.equal(cache.layers[0].keys, tensors[0])
    assert calls == [1]
    assert held_state_of(cache) is None  # an ordinary cache again
    cache.layers[0].update(torch.ones(2, 3, 1, 4), torch.ones(2, 3, 1, 4))
    assert cache.layers[0].get_seq_length() == 6


def test_a_sliding_layer_gets_its_count_and_no_class_is_registered() -> None:
    before = dict(DYNAMIC_LAYER_TYPE_MAPPING)
    layer = DynamicSlidingWindowLayer(sliding_window=16)
    cache = DynamicCache()
    cache.layers = [layer]
    tensors = [torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 4)]
    hold(cache, 7, _reader(tensors, []), torch.float32)
    assert isinstance(layer, DynamicSlidingWindowLayer) and layer.is_sliding
    assert torch.equal(layer.keys, tensors[0])
    assert layer.cumulative_length == 7
    assert dict(DYNAMIC_LAYER_TYPE_MAPPING) == before
    assert held_class(DynamicSlidingWindowLayer)._layer_type is None


def test_holder_copies_the_state_out_before_it_changes_and_forgets_dead_caches() -> None:
    cache = DynamicCache()
    cache.layers = [DynamicLayer()]
    tensors = [torch.randn(1, 1, 3, 2), torch.randn(1, 1, 3, 2)]
    calls: list[int] = []
    holder = Holder()
    holder.set(hold(cache, 3, _reader(tensors, calls), torch.float32))
    holder.release()  # a new prefill is about to reset the state
    assert calls == [1]
    assert torch.equal(cache.layers[0].values, tensors[1])
    other = DynamicCache()
    other.layers = [DynamicLayer()]
    holder.set(hold(other, 3, _reader(tensors, calls), torch.float32))
    del other
    holder.release()
    assert calls == [1]  # nobody holds that cache any more: nothing is copied
