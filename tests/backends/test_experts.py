"""Issue 31, item 5: mixture-of-experts routing exports as data, not baked in.

Hugging Face experts layers pick experts per token from the router's top-k. On a CPU their
default form calls ``transformers::grouped_mm_fallback``, which no ONNX exporter translates
(Mixtral's candidates all failed), and their eager form loops over the experts one batch hit.
Exports now use the batched form, which indexes the weights with the top-k tensor, and the
candidate is checked on value probes (other values, other routing) like any other.
"""

from __future__ import annotations

import pytest
import torch

import tunetree as tt
from tunetree.candidates.evaluate import Status

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")


def mixtral_block() -> torch.nn.Module:
    config = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(config).eval().model.layers[0].mlp


def test_experts_export_with_routing_as_data_and_match_eager_on_new_routing() -> None:
    block = mixtral_block()
    config = block.experts.config
    before = config._experts_implementation
    data = [torch.randn(1, 4, 32), torch.randn(2, 7, 32), torch.randn(3, 10, 32)]
    result = tt.tune(
        block,
        data,
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    row = result.graphs[0].rows[0]
    assert row.status is Status.OK, row.reason  # built, matched eager, passed value probes
    assert config._experts_implementation == before  # the user's choice is put back
    runner = row.runner
    assert runner is not None
    torch.manual_seed(1)
    x = 3 * torch.randn(2, 9, 32)  # values, and so routing, the export never saw
    with torch.no_grad():
        routed = block.gate(x.view(-1, 32))[2]
        seen = block.gate(data[1].view(-1, 32))[2]
        assert not torch.equal(routed[: len(seen)], seen)
        torch.testing.assert_close(runner(x), block(x), rtol=1e-5, atol=1e-5)
    result.undo()
