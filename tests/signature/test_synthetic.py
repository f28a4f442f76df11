"""Calls made from a graph key alone (``tunetree.signature.synthetic``) are made as the
module's callers make them.

An encoder-decoder's ``generate`` passes the encoder's output to every decoder step as a
``BaseModelOutput``; its graph key records it as a mapping of its fields, and T5, BART, Marian
and Whisper read it by position (``encoder_outputs[0]``) when it is not that class. Rebuilt as
a plain dict, loading a saved runner of such a step (which learns its output structure by
running the module on a call made from the key) raised ``KeyError: 0``: every saved
encoder-decoder ``generate`` was refused by ``tt.load``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import tunetree as tt
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.graph import GraphKey
from tunetree.signature.synthetic import call_from_key

transformers = pytest.importorskip("transformers")
from transformers.modeling_outputs import BaseModelOutput  # noqa: E402


class Decoder(nn.Module):
    """Reads its encoder's output as T5's and BART's forwards do."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, encoder_outputs: object) -> torch.Tensor:
        if not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs[0])  # type: ignore[index]
        return self.proj(x) + encoder_outputs.last_hidden_state.mean(1, keepdim=True)


def encoded(batch: int, length: int) -> BaseModelOutput:
    return BaseModelOutput(last_hidden_state=torch.randn(batch, length, 8))


def test_a_model_output_in_a_key_is_rebuilt_readable_by_name_and_position() -> None:
    key = GraphKey.of((), {"encoder_outputs": encoded(2, 5)})
    rebuilt = call_from_key(key, torch.device("cpu")).kwargs["encoder_outputs"]
    assert list(rebuilt) == ["last_hidden_state"]
    assert rebuilt["last_hidden_state"].shape == (2, 5, 8)
    assert rebuilt[0] is rebuilt["last_hidden_state"]
    assert rebuilt[:1] == (rebuilt[0],)
    assert len(rebuilt) == 1


def test_a_runner_taking_a_model_output_saves_and_loads(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    calls = [{"x": torch.randn(2, 3, 8), "encoder_outputs": encoded(2, 5)} for _ in range(2)]
    result = tt.tune(
        Decoder().eval(),
        calls,
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    assert all(g.winner is not None for g in result.graphs), result.table()
    torch.manual_seed(1)
    fresh = Decoder().eval()
    fresh.load_state_dict(result.model.state_dict())
    loaded = tt.load(fresh, tt.save(result, tmp_path / "decoder.tt"))
    unseen = {"x": torch.randn(2, 3, 8), "encoder_outputs": encoded(2, 5)}
    with torch.no_grad():
        want = result.model(**unseen)
        assert torch.allclose(loaded(**unseen), want, atol=1e-5)
    assert dispatcher_of(loaded).fallback_calls == 0


def test_a_sliding_window_layer_below_its_window_is_rebuilt_with_its_position() -> None:
    """Below the window the layer's ``cumulative_length`` repeats the keys' length and is keyed
    as ``axis: keys[-2]``; rebuilding such a key (to learn a saved decode step's output
    structure) raised "cannot rebuild a saved constant of kind 'derived'"."""
    from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer

    layer = DynamicSlidingWindowLayer(sliding_window=16)
    layer.update(torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8))
    cache = DynamicCache()
    cache.layers = [layer]
    key = GraphKey.of((), {"past_key_values": cache})
    assert "derived" in repr(key.kwargs)
    call = call_from_key(key, torch.device("cpu"), limit=64)  # the config accounts for 16
    rebuilt = call.kwargs["past_key_values"].layers[0]
    assert rebuilt.keys.shape == (2, 2, 9, 8)
    assert rebuilt.cumulative_length == 9 and rebuilt.sliding_window == 16


def test_a_derived_attribute_rebuilds_only_as_its_layer_keys_it() -> None:
    """A saved ``axis: ...`` text is read back only where the attribute is keyed so (the
    inverse of ``hf.key_value``); a text naming another tensor or axis is refused."""
    from tunetree.hf import BELOW_CAPACITY, derived_value

    keys = torch.zeros(2, 2, 9, 8)
    dynamic = {"keys": keys, "values": keys}
    assert derived_value(dynamic, "cumulative_length", "axis: keys[-2]") == 9
    assert derived_value(dynamic, "cumulative_length", str(BELOW_CAPACITY)) == 0
    assert derived_value(dynamic, "head_dim", "axis: keys[-1]") == 8
    assert derived_value(dynamic, "cumulative_length", "axis: values[0]") is None
    assert derived_value(dynamic, "cumulative_length", "axis: keys[7]") is None
    assert derived_value(dynamic, "head_dim", str(BELOW_CAPACITY)) is None
    static = {**dynamic, "max_cache_len": 16}
    assert derived_value(static, "cumulative_length", "axis: keys[-2]") is None
