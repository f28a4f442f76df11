from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tunetree.runtime.wrap import dispatcher_of


def encoder(d: int = 32, layers: int = 4, fast_path: bool = False) -> nn.Module:
    """A transformer encoder; ``fast_path`` keeps PyTorch's fused layer op, which an
    activation other than relu/gelu turns off (the layers then run their submodules)."""
    torch.manual_seed(0)
    activation: Any = "relu" if fast_path else (lambda x: torch.nn.functional.relu(x))
    layer = nn.TransformerEncoderLayer(d, 4, 2 * d, batch_first=True, activation=activation)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()


def test_encoder_depth_counts() -> None:
    info = tt.inspect(encoder(), [torch.randn(2, 8, 32) for _ in range(2)])
    counts = [s.modules for s in info.summaries()]
    assert counts == [1, 4, 32]
    assert info.cut(1) == [f"layers.{i}" for i in range(4)]
    assert info.modules["layers.0.linear1"].depth == 2
    assert info.modules["layers.0"].calls == 2
    assert "layers.0.self_attn" in str(info)
    # the layers run their submodules; attention still takes its own fused op
    assert info.fused == {f"layers.{i}.self_attn": "_native_multi_head_attention" for i in range(4)}


def test_layers_on_the_fused_fast_path_are_leaves_and_named() -> None:
    """Issue 18: without autograd the layers run one fused op and their submodules never
    run; recording them (hooks turn the fast path off) made tunetree tune a depth that the
    tuned model never executes."""
    info = tt.inspect(encoder(fast_path=True), [torch.randn(2, 8, 32) for _ in range(2)])
    assert [s.modules for s in info.summaries()] == [1, 4]
    assert info.fused == {f"layers.{i}": "_transformer_encoder_layer_fwd" for i in range(4)}
    assert "layers.0.linear1" not in info.modules
    assert info.modules["layers.0"].is_leaf and info.modules["layers.0"].graphs
    note = info.fast_path_note()
    assert "4 modules run PyTorch's fused inference fast path" in note
    assert "TransformerEncoderLayer" in note and note in str(info)


def test_multihead_attention_on_its_fast_path_is_found() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
            self.out = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.attn(x, x, x)[0])

    torch.manual_seed(0)
    info = tt.inspect(Block().eval(), [torch.randn(2, 5, 16)])
    assert info.fused == {"attn": "_native_multi_head_attention"}
    assert set(info.cut(1)) == {"attn", "out"}


def test_a_model_that_cannot_run_under_a_dispatch_mode_is_still_inspected() -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    class Picky(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if _get_current_dispatch_mode() is not None:
                raise RuntimeError("no dispatch modes here")
            return super().forward(x)

    info = tt.inspect(Picky(4, 4).eval(), [torch.randn(2, 4)])
    assert info.fused == {} and info.modules[""].calls == 1


def test_auto_tune_warns_about_fused_fast_paths(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        tt.auto_tune(encoder(fast_path=True), [torch.randn(2, 8, 32)], dry_run=True)
    assert any("fused inference fast path" in r.getMessage() for r in caplog.records)


def test_cut_includes_shallower_leaves() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU())).eval()
    info = tt.inspect(model, [torch.randn(2, 4)])
    assert info.cut(0) == [""]
    assert info.cut(1) == ["0", "1"]
    assert info.cut(2) == ["0", "1.0", "1.1"]


class Positions(nn.Module):
    """Positional embeddings made from the input's shape alone (as Marian's are)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(64, 8))

    def forward(self, shape: torch.Size) -> torch.Tensor:
        return self.table[torch.arange(shape[1])]


class WithPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.positions = Positions()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x + self.positions(x.shape))


def test_a_module_called_without_tensors_is_left_out_of_every_cut() -> None:
    # Each shape it is called with would be a graph of its own (the sizes are constants of
    # the call), so a runner of the recorded ones never served an unseen length: Marian's
    # generate fell back at depth 1 on every unseen length (issue 31).
    torch.manual_seed(0)
    model = WithPositions().eval()
    info = tt.inspect(model, [torch.randn(2, n, 8) for n in (5, 9)])
    assert info.modules["positions"].takes_no_tensor
    assert not info.modules["proj"].takes_no_tensor
    assert info.cut(1) == ["proj"]
    unseen = torch.randn(2, 7, 8)
    with torch.no_grad():
        want = model(unseen)
    result = tt.tune(
        model,
        [torch.randn(2, n, 8) for n in (5, 9)],
        depth=1,
        strategy=tt.HighestThroughputStrategy([tt.backends.Eager()]),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    with torch.no_grad():
        got = result.model(unseen)
    assert torch.equal(got, want)
    assert {g.path for g in result.graphs} == {"proj"}
    assert dispatcher_of(model.positions) is None  # not wrapped: it runs as it is
    result.undo()


def test_time_shares_are_consistent() -> None:
    info = tt.inspect(encoder(), [torch.randn(2, 8, 32)])
    root = info.modules[""]
    assert 0 < root.total_s <= info.total_s * 1.01
    assert all(m.self_s <= m.total_s + 1e-9 for m in info.modules.values())


def test_multiple_graphs_per_module() -> None:
    model = encoder(layers=2)
    data = [torch.randn(2, 8, 32), torch.randn(2, 16, 32), torch.randn(2, 8, 32)]
    info = tt.inspect(model, data, dynamic_shapes=False)
    graphs = info.modules["layers.0"].graphs
    assert len(graphs) == 2
    assert sorted(len(g.samples) for g in graphs.values()) == [1, 2]
    assert info.summary(1).graphs == 4
    # by default the varying axis becomes a range: one graph holding every sample
    (ranged,) = tt.inspect(model, data).modules["layers.0"].graphs.values()
    assert str(ranged.key) == "(f32[2, seq 8..16, 32])"
    assert len(ranged.samples) == 3


def test_dict_kwargs_dataset_and_hf_model() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    data = [
        {
            "input_ids": torch.randint(0, 100, (2, 12)),
            "attention_mask": torch.ones(2, 12, dtype=torch.long),
        }
    ]
    info = tt.inspect(model, data)
    assert info.summary(0).modules == 1
    assert info.cut(1) == ["embeddings", "encoder", "pooler"]
    depth2 = info.cut(2)
    assert "embeddings.word_embeddings" in depth2
    assert "encoder.layer.0" in depth2 and "encoder.layer.1" in depth2
    assert "pooler.dense" in depth2
    # The recorded eager output keeps its Hugging Face type.
    assert type(info.outputs[0]).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"
    root_graph = next(iter(info.modules[""].graphs.values()))
    # keyword arguments are bound to the forward's parameters: input_ids, attention_mask
    assert str(root_graph.key) == "(i64[2,12], i64[2,12])"


def test_pipeline_object_with_call_function() -> None:
    class Pipeline:
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.encode = nn.Linear(4, 8)
            self.decode = nn.Sequential(nn.ReLU(), nn.Linear(8, 2))

    pipe = Pipeline()
    info = tt.inspect(pipe, [torch.randn(3, 4)], call=lambda p, x: p.decode(p.encode(x)))
    assert info.cut(0) == ["encode", "decode"]
    assert info.cut(1) == ["encode", "decode.0", "decode.1"]


def test_bad_inputs_raise_typed_errors() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(tt.InvalidInputError, match="empty"):
        tt.inspect(model, [])
    with pytest.raises(tt.InvalidInputError, match="wrap a single input"):
        tt.inspect(model, torch.randn(2, 2))
    with pytest.raises(tt.InvalidInputError, match="dataset item"):
        tt.inspect(model, [object()])
    with pytest.raises(tt.InvalidInputError, match=r"neither an nn\.Module"):
        tt.inspect(object.__new__(type("P", (), {})), [torch.randn(1)])


def small_bert() -> Any:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


def bert_data() -> list[dict[str, torch.Tensor]]:
    """The issue's traffic: batch and sequence length both vary."""
    torch.manual_seed(0)
    return [
        {
            "input_ids": torch.randint(0, 1000, (b, n)),
            "attention_mask": torch.ones(b, n, dtype=torch.long),
        }
        for b, n in zip([1, 4, 8, 2, 16], [17, 64, 128, 200, 33], strict=True)
    ]


def test_axes_that_vary_become_shared_ranges_on_bert() -> None:
    info = tt.inspect(small_bert(), bert_data())
    (root,) = info.modules[""].graphs.values()
    assert str(root.key) == "(i64[batch 1..16, seq 17..200], i64[batch 1..16, seq 17..200])"
    assert len(root.samples) == 5 and not root.probes
    # submodules borrow the root's names for axes with the same sizes
    (layer,) = info.modules["encoder.layer.0"].graphs.values()
    assert "f32[batch 1..16, seq 17..200, 64]" in str(layer.key)
    # dynamic_shapes=False: every exact shape is its own graph, as before
    exact = tt.inspect(small_bert(), bert_data(), dynamic_shapes=False)
    assert len(exact.modules[""].graphs) == 5


def test_declared_dims_reach_every_module() -> None:
    batch, seq = tt.Dim("batch", 1, 32), tt.Dim("seq", 1, 256)
    info = tt.inspect(
        small_bert(),
        bert_data()[:2],
        dynamic_shapes={
            "input_ids": {0: batch, 1: seq},
            "attention_mask": {0: "batch", 1: "seq"},
        },
    )
    (root,) = info.modules[""].graphs.values()
    assert str(root.key) == "(i64[batch 1..32, seq 1..256], i64[batch 1..32, seq 1..256])"
    assert len(root.samples) == 2  # probe calls widen ranges, they are not samples
    assert root.probes and info.modules[""].calls == 2
    (layer,) = info.modules["encoder.layer.1"].graphs.values()
    assert "f32[batch 1..32, seq 1..256, 64]" in str(layer.key)
    assert len(layer.samples) == 2
    with pytest.raises(tt.InvalidInputError, match="outside the declared"):
        tt.inspect(
            small_bert(),
            bert_data(),
            dynamic_shapes={"input_ids": {0: tt.Dim("batch", 1, 8)}},
        )


def test_auto_tune_refuses_a_min_depth_below_every_executed_module() -> None:
    """The fused layers are the deepest modules: a min_depth past them names the depth and why,
    instead of trying nothing and reporting the model "left untuned"."""
    with pytest.raises(tt.TunetreeError, match=r"min_depth=2 .* \(depth 1\).*fused"):
        tt.auto_tune(encoder(fast_path=True), [torch.randn(2, 8, 32)], min_depth=2, cache=False)


class _MaskedLayer(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return x if mask is None else x * mask.unsqueeze(-1)


class _SkipsMaskOfOne(nn.Module):
    """Like a Llama model: a batch of one unpadded row gives its layer no mask at all."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = _MaskedLayer()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.layer(x, None if x.shape[0] == 1 else mask)


def test_a_submodule_pattern_that_follows_the_root_serves_the_roots_whole_range() -> None:
    """Issue 33: Llama's depth-1 plan sent unseen calls inside the root's ranges to the original
    forward. The layer's masked pattern saw only the padded calls (batch 2..3, seq 20..32) of a
    root tuned on batch 1..3, seq 8..32; its axes follow the root's call for call, so its graph
    takes the root's whole range (and its candidates are checked at the widened ends)."""
    data = [(torch.randn(b, s, 4), torch.ones(b, s)) for b, s in ((1, 8), (2, 20), (3, 32))]
    info = tt.inspect(_SkipsMaskOfOne().eval(), data)
    (root,) = info.modules[""].graphs
    assert root.dims() == {"batch": tt.Dim("batch", 1, 3), "seq": tt.Dim("seq", 8, 32)}
    masked = next(k for k in info.modules["layer"].graphs if k.is_dynamic)
    assert masked.dims() == root.dims()


def test_an_axis_that_only_shares_sizes_with_the_root_keeps_its_own_range() -> None:
    """Sizes that do not follow the root call for call keep the range they were seen in."""

    class Reversed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = _MaskedLayer()

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            flipped = x.flip(0)[:, : 40 - x.shape[1]]  # seq 32 -> 8, 20 -> 20, 8 -> 32
            return self.layer(flipped, None if x.shape[0] == 1 else mask[:, : flipped.shape[1]])

    data = [(torch.randn(b, s, 4), torch.ones(b, s)) for b, s in ((1, 8), (2, 20), (3, 32))]
    info = tt.inspect(Reversed().eval(), data)
    masked = next(k for k in info.modules["layer"].graphs if k.is_dynamic)
    assert masked.dims() == {"batch": tt.Dim("batch", 1, 3), "seq": tt.Dim("seq", 8, 20)}


class _Counted(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(x)


def test_inspection_without_warm_up_runs_each_call_once_unless_a_fast_path_may_run() -> None:
    """A recorded plan's load measures nothing: the untimed first call (a warm-up, and the
    search for fused fast paths) is skipped where no module could take a fast path, and kept
    where one could (it alone finds them)."""
    calls = [torch.randn(2, 8, 32) for _ in range(3)]
    plain = _Counted(encoder())  # its attention modules may take their fused op: kept
    torch.manual_seed(0)
    mlp = _Counted(nn.Sequential(nn.Linear(32, 32), nn.ReLU()).eval())
    warmed = tt.inspect(mlp, calls)
    assert mlp.calls == 4
    mlp.calls = 0
    cold = tt.inspect(mlp, calls, warm_up=False)
    assert mlp.calls == 3
    assert sorted(cold.modules) == sorted(warmed.modules) and cold.fused == {}
    assert all(torch.equal(a, b) for a, b in zip(cold.outputs, warmed.outputs, strict=True))
    info = tt.inspect(plain.eval(), calls, warm_up=False)
    assert plain.calls == 4
    assert info.fused == {
        f"inner.layers.{i}.self_attn": "_native_multi_head_attention" for i in range(4)
    }
