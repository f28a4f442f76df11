"""The stateful export runs in OpenVINO's fused kernels: attention with its cache, RoPE."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
ov = pytest.importorskip("openvino")

from tunetree.generation.stateful import stateful_model  # noqa: E402
from tunetree.generation.stateful_fusion import fold_scalar_converts  # noqa: E402

SMALL = dict(
    vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
)  # fmt: skip


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def served(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    config_type = transformers.LlamaConfig if request.param == "llama" else transformers.Qwen2Config
    model = transformers.AutoModelForCausalLM.from_config(config_type(**SMALL)).eval()
    return model, stateful_model(model)


def _runtime_layers(tuned: torch.nn.Module) -> list:
    return list(tuned.forward.runner.compiled.get_runtime_model().get_ordered_ops())


def _layer_type(node) -> str:
    return str(node.get_rt_info()["layerType"].astype(str))


def test_attention_runs_as_the_stateful_sdpa_kernel_with_its_cache(
    served: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    _, tuned = served
    layers = _runtime_layers(tuned)
    types = Counter(_layer_type(node) for node in layers)
    attentions = [node for node in layers if _layer_type(node) == "ScaledDotProductAttention"]
    assert len(attentions) == SMALL["num_hidden_layers"], types
    assert types["Softmax"] == 0 and types["MatMul"] == 0, types
    for node in attentions:
        # the fused cache update: the kernel reads both states (keys, values) itself
        sources = [_layer_type(port.get_source_output().get_node()) for port in node.inputs()]
        assert sources.count("MemoryInput") == 2, sources


def test_the_cache_is_held_in_f32_where_results_are_kept(
    served: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    _, tuned = served
    compiled = tuned.forward.runner.compiled
    for name in ("KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION"):
        assert compiled.get_property(name) == ov.Type.f32  # the plugin's default: u8


def test_rotary_embedding_runs_as_the_rope_kernel(
    served: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    _, tuned = served
    types = Counter(_layer_type(node) for node in _runtime_layers(tuned))
    assert types["RoPE"] == 2 * SMALL["num_hidden_layers"], types  # queries and keys


def test_fused_kernels_generate_eagers_tokens_across_batches_and_states(
    served: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    model, tuned = served
    gen = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    gen.update(return_dict_in_generate=True, output_logits=True)
    for batch, length in [(1, 3), (3, 19), (2, 11)]:  # the batch changes between calls
        g = torch.Generator().manual_seed(batch * length)
        ids = torch.randint(3, 500, (batch, length), generator=g)
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[-1, : length // 3] = 0  # a left-padded row
        got = tuned.generate(input_ids=ids, attention_mask=mask, **gen)
        expected = model.generate(input_ids=ids, attention_mask=mask, **gen)
        assert torch.equal(got.sequences, expected.sequences)
        for step, (a, b) in enumerate(zip(expected.logits, got.logits, strict=True)):
            # every decode step through the fused kernel and its cache, not only the prefill
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-3, msg=f"step {step}")
    assert tuned.forward.counts.original == 0


def test_only_exact_one_element_conversions_are_folded() -> None:
    from openvino import opset13

    x = opset13.parameter([2, 3], ov.Type.f32, name="x")
    minus_one = opset13.convert(opset13.constant(np.int32(-1)), "f32")
    inexact = opset13.convert(opset13.constant(np.int32(2**24 + 1)), "f32")  # not an f32
    table = opset13.convert(opset13.constant(np.arange(3, dtype=np.int32)), "f32")
    product = opset13.multiply(x, minus_one)
    model = ov.Model([opset13.add(opset13.add(product, inexact), table)], [x])
    assert fold_scalar_converts(model) == 1
    assert Counter(op.get_type_name() for op in model.get_ordered_ops())["Convert"] == 2
    folded = product.input_value(1).get_node()
    assert folded.get_type_name() == "Constant"
    assert folded.get_output_element_type(0) == ov.Type.f32
    assert folded.get_data().tolist() == -1.0


def test_attention_takes_its_query_straight_from_the_rotary_kernel(
    served: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    """No reshape of the query to the shape it has sits between RoPE and attention: OpenVINO
    recomputes each such node's target shape on every step (two per layer were left)."""
    _, tuned = served
    layers = _runtime_layers(tuned)
    attentions = [n for n in layers if _layer_type(n) == "ScaledDotProductAttention"]
    for node in attentions:
        query = node.input(0).get_source_output().get_node()
        assert _layer_type(query) == "RoPE", _layer_type(query)
        users = {_layer_type(i.get_node()) for i in node.output(0).get_target_inputs()}
        assert "Reshape" not in users, users


def test_only_reshapes_to_the_shape_they_have_are_dropped() -> None:
    from tunetree.generation.stateful_export import drop_identity_reshapes

    class Shapes(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            same = x.reshape(x.shape[0], 4, x.shape[2]) * 2  # the shape x has: dropped
            flat = same.view(x.shape[0], -1)  # another shape: kept
            return flat + 1, x.view(x.shape)  # an output's own node: kept (the signature)

    dim = torch.export.Dim.DYNAMIC
    x = torch.randn(3, 4, 5)
    exported = torch.export.export(Shapes(), (x,), dynamic_shapes=({0: dim, 2: dim},))
    expected = exported.module()(x)
    assert drop_identity_reshapes(exported) == 1
    targets = [n.target for n in exported.graph_module.graph.nodes if n.op == "call_function"]
    assert (
        targets.count(torch.ops.aten.view.default) + targets.count(torch.ops.aten.reshape.default)
        == 2
    ), targets
    other = torch.randn(2, 4, 7)
    for value in (x, other):
        got = exported.module()(value)
        want = Shapes()(value)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
    for a, b in zip(exported.module()(x), expected, strict=True):
        assert torch.equal(a, b)
