"""Issue 31: Hugging Face models' own exporter paths are taken while an exporter traces.

Longformer cuts its sequence into overlapping chunks with ``as_strided`` over a view whose
sizes ``torch.div`` returns as tensors, which no exporter can trace ("the graph depends on
input values"); with ``config.onnx_export`` it takes ``unfold``, the same windows of the same
values. Exports now set that flag and put it back.
"""

from __future__ import annotations

import pytest
import torch

import tunetree as tt
from tunetree.backends.export_context import exporter_paths
from tunetree.candidates.evaluate import Status

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")


def longformer() -> torch.nn.Module:
    config = transformers.LongformerConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, attention_window=4, max_position_embeddings=96, pad_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LongformerModel(config).eval()


def call(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length // 2 :] = 0
    return {
        "input_ids": torch.randint(3, 128, (batch, length), generator=g),
        "attention_mask": mask,
    }


def test_the_flag_is_set_only_while_exporting_and_only_where_a_config_declares_it() -> None:
    model = longformer()
    other = torch.nn.Linear(2, 2)
    other.config = object()  # a config without the flag is not touched
    with exporter_paths(torch.nn.ModuleList([model, other])):
        assert model.config.onnx_export is True
    assert model.config.onnx_export is False


def test_a_longformer_layer_exports_to_onnx_and_matches_eager_on_unseen_lengths() -> None:
    model = longformer()
    result = tt.tune(
        model,
        [call(1, 8, 0), call(2, 12, 1), call(3, 16, 2)],
        depth=2,
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    layer = next(g for g in result.graphs if g.path == "encoder.layer.0")
    row = layer.rows[0]
    assert row.status is Status.OK, row.reason  # before: "the graph depends on input values"
    assert model.config.onnx_export is False
    unseen = call(2, 20, 5)
    with torch.no_grad():
        want = model(**unseen).last_hidden_state
        got = result.model(**unseen).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
