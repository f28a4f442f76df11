"""Exported attention computes what eager computes (issue 20): rows a boolean mask hides
entirely are zeros (left-padded batches), and grouped-query attention converts for OpenVINO."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tunetree as tt
from tests.fakes import quick_tune


class Attention(nn.Module):
    def __init__(self, kv_heads: int = 4) -> None:
        super().__init__()
        self.q = nn.Linear(32, 32)
        self.kv = nn.Linear(32, 2 * 8 * kv_heads)
        self.kv_heads = kv_heads

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 4, 8).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, 8).permute(2, 0, 3, 1, 4)
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        full = causal[None, None] & mask[:, None, None, :].bool()  # left padding hides rows
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=full, enable_gqa=self.kv_heads != 4)
        return out.transpose(1, 2).reshape(b, n, 32)


def left_padded(batch: int, length: int) -> dict[str, torch.Tensor]:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1:, : length // 2] = 0
    return {"x": torch.randn(batch, length, 32), "mask": mask}


@pytest.mark.parametrize(
    ("backend", "kv_heads"),
    [("onnxruntime", 4), ("onnxruntime", 2), ("openvino", 4), ("openvino", 2)],
)
def test_exported_attention_matches_eager_on_padded_rows_and_grouped_heads(
    backend: str, kv_heads: int
) -> None:
    pytest.importorskip(backend)
    torch.manual_seed(0)
    model = Attention(kv_heads).eval()
    data = [left_padded(2, 6), left_padded(3, 10)]
    assert (model(**data[1])[1, :5] == 0).all()  # eager's zeros on the hidden rows
    chosen = tt.backends.OnnxRuntime() if backend == "onnxruntime" else tt.backends.OpenVINO()
    result = quick_tune(model, data, [chosen], cache=False)
    (graph,) = result.graphs
    assert graph.winner is not None, result.table()
    with torch.no_grad():
        unseen = left_padded(3, 8)
        assert torch.allclose(result.model(**unseen), model(**unseen), atol=1e-5)
    assert F.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def test_openvino_attention_keeps_eager_results_at_head_size_128() -> None:
    """OpenVINO 2026.4 computes wrong values when the attention's result is read before its
    layout transpose (BERT, head size 128, sequence 128); the null key avoids that read."""
    pytest.importorskip("openvino")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=256, num_hidden_layers=1, num_attention_heads=2, intermediate_size=512
    )
    model = transformers.BertModel(config).eval()
    mask = torch.ones(2, 128, dtype=torch.long)
    mask[1, 64:] = 0
    data = [{"input_ids": torch.randint(0, 1000, (2, 128)), "attention_mask": mask}]
    result = quick_tune(model, data, [tt.backends.OpenVINO()], cache=False)
    (graph,) = result.graphs
    assert graph.winner is not None, result.table()


class NormalHead(nn.Module):
    """A forecaster's head: a normal from the features, the log-likelihood of the targets.

    Built with its default ``validate_args``, the distribution checks its parameters and the
    targets against their constraints, a branch on values (TimeSeriesTransformer's head)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, scale = self.proj(x).unbind(-1)
        dist = torch.distributions.Normal(loc, F.softplus(scale) + 1e-3)
        return dist.log_prob(target), dist.mean


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_distribution_built_with_its_default_checks_exports(backend: str) -> None:
    """Before, the build failed: "the graph depends on input values" at the constraint check."""
    pytest.importorskip(backend)
    torch.manual_seed(0)
    model = NormalHead().eval()
    data = [(torch.randn(2, 5, 8), torch.randn(2, 5)), (torch.randn(3, 7, 8), torch.randn(3, 7))]
    chosen = tt.backends.OnnxRuntime() if backend == "onnxruntime" else tt.backends.OpenVINO()
    result = quick_tune(model, data, [chosen], cache=False)
    (graph,) = result.graphs
    assert graph.winner is not None, result.table()
    unseen = (torch.randn(3, 6, 8), torch.randn(3, 6))
    with torch.no_grad():
        for got, want in zip(result.model(*unseen), model(*unseen), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.distributions.Distribution._validate_args is True  # the default put back
    with pytest.raises(ValueError, match="scale"):
        torch.distributions.Normal(0.0, torch.tensor(-1.0))  # eager still checks


class FirstStep(nn.Module):
    """A decoder's first step: appends its keys to an empty Hugging Face dynamic cache."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, past_key_values: Any) -> torch.Tensor:
        k = self.lin(x)[:, None]
        keys, _ = past_key_values.update(k, k, 0)
        return keys.sum(-2)


def test_openvino_converts_the_first_update_of_an_empty_dynamic_cache() -> None:
    """The layer starts from ``torch.tensor([])`` and concatenates the step's keys to it, which
    OpenVINO could not convert ("cannot convert: SequenceMark, aten.cat", the reason the probe
    saw on Jamba's prefill and SpeechT5's first decoder step)."""
    pytest.importorskip("openvino")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = FirstStep().eval()
    data = [(torch.randn(b, n, 4), transformers.DynamicCache()) for b, n in ((2, 3), (3, 5))]
    result = quick_tune(model, data, [tt.backends.OpenVINO()], cache=False)
    (graph,) = result.graphs
    assert graph.winner is not None, result.table()
    x = torch.randn(3, 4, 4)
    with torch.no_grad():
        got = graph.winner.runner(x, transformers.DynamicCache())
        torch.testing.assert_close(got, model(x, transformers.DynamicCache()))
    assert torch.cat is torch._C._VariableFunctions.cat  # put back
    assert torch.cat([torch.tensor([]), torch.ones(2, 2)]).shape == (2, 2)
