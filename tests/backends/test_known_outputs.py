"""A runner loaded beside eager's real outputs takes their structure instead of a fake run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tunetree.backends import flat
from tunetree.backends.known_outputs import known_output_spec, outputs_known
from tunetree.errors import BackendError
from tunetree.signature.graph import GraphKey, flatten

transformers = pytest.importorskip("transformers")


class Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x * 2


def key_of(x: torch.Tensor) -> GraphKey:
    return GraphKey.of((x,), {})


def test_eagers_output_gives_the_structure_and_no_fake_run_happens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, x = Pair(), torch.ones(2, 3)
    learnt = flat.learn_output_spec(module, key_of(x), torch.device("cpu"))  # the fake run

    def no_fake_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("ran on fake tensors")

    monkeypatch.setattr(flat, "run_fake", no_fake_run)
    with outputs_known(key_of(x), module(x)):
        assert flat.learn_output_spec(module, key_of(x), torch.device("cpu")) == learnt
        # another key (another graph's runner): its structure is not known here
        with pytest.raises(BackendError, match="ran on fake tensors"):
            flat.learn_output_spec(module, key_of(torch.ones(5, 3, 1)), torch.device("cpu"))
    with pytest.raises(BackendError, match="ran on fake tensors"):  # outside the block
        flat.learn_output_spec(module, key_of(x), torch.device("cpu"))


def test_an_output_holding_a_cache_object_keeps_the_fake_run() -> None:
    cache = transformers.DynamicCache()
    cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
    output = transformers.modeling_outputs.BaseModelOutputWithPast(
        last_hidden_state=torch.zeros(1, 3, 4), past_key_values=cache
    )
    key = key_of(torch.zeros(1, 3))
    with outputs_known(key, output):
        assert known_output_spec(key) is None
    with outputs_known(key, (torch.zeros(1), None)):
        assert known_output_spec(key) == flatten((torch.zeros(1), None))[1]
