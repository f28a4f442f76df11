"""Flat outputs: eager's output structure rebuilt around a flat backend's tensors, once per call
(issue 22: per-call work), with cache objects written back into the caller's cache."""

from __future__ import annotations

import pytest
import torch

from tunetree.backends.flat import FlatOutputs

transformers = pytest.importorskip("transformers")


def test_an_output_without_caches_is_built_once_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = transformers.modeling_outputs.BaseModelOutputWithPooling
    eager = outputs(last_hidden_state=torch.zeros(2, 3, 4), pooler_output=torch.zeros(2, 4))
    record = FlatOutputs.of(eager)
    assert not record.holds_cache
    built = []
    post_init = outputs.__post_init__

    def counting(self):  # type: ignore[no-untyped-def]
        built.append(1)
        post_init(self)

    monkeypatch.setattr(outputs, "__post_init__", counting)
    tensors = [torch.ones(2, 3, 4), torch.ones(2, 4)]
    rebuilt = record.rebuild(tensors, ((), {}))
    assert len(built) == 1  # before: twice (once more to look for cache objects)
    assert type(rebuilt) is outputs and rebuilt.last_hidden_state is tensors[0]
    assert rebuilt.pooler_output is tensors[1]


def test_an_output_holding_a_cache_is_written_into_the_callers_cache() -> None:
    cache = transformers.DynamicCache()
    cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
    eager = transformers.modeling_outputs.BaseModelOutputWithPast(
        last_hidden_state=torch.zeros(1, 3, 4), past_key_values=cache
    )
    record = FlatOutputs.of(eager)
    assert record.holds_cache
    given = transformers.DynamicCache()
    given.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
    tensors = [torch.ones(1, 3, 4), torch.ones(1, 2, 3, 4), torch.full((1, 2, 3, 4), 2.0)]
    rebuilt = record.rebuild(tensors, ((), {"past_key_values": given}))
    assert rebuilt.past_key_values is given  # eager updates the cache it was given, in place
    assert torch.equal(given.layers[0].values, tensors[2])
