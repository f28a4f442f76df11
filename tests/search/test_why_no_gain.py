"""A depth that gained nothing says why in its row: each backend's most common outcome over the
cut's graphs (not a bare "no change", nor only the first reason met)."""

from __future__ import annotations

import pytest
import torch

import tunetree as tt
from tests.fakes import Failing, Wrong, mlp


def tuned(backends: list) -> tt.AutoTuneResult:
    return tt.auto_tune(
        mlp(),
        [torch.randn(4, 16)],
        max_depth=1,
        strategy=tt.HighestThroughputStrategy(backends),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )


def test_a_depth_that_kept_eager_says_why_per_backend() -> None:
    result = tuned([Failing("build"), Wrong(0.5), tt.backends.Eager()])
    assert result.depth is None
    rows = {row.depth: row for row in result.rows}
    depth1 = rows[1].status_text  # three graphs: two Linear, one ReLU
    assert depth1.startswith("no change: every graph kept eager: ")
    # The ReLU's candidates were not built: it is a twin of the first Linear, where eager won.
    assert (
        "fake-failing: 2 of 3 graphs failed: build: RuntimeError: backend exploded while building"
        " (and 1 graph with another reason)" in depth1
    )
    assert "fake-wrong(offset=0.5): 2 of 3 graphs rejected: output 0 differs from eager" in depth1
    assert "; eager:" not in depth1  # eager was usable everywhere: not a reason
    assert "fake-failing: 1 of 1 graphs failed" in rows[0].status_text
    assert depth1 in str(result)


def test_a_depth_where_every_module_failed_names_every_backend() -> None:
    result = tuned([Failing("build"), Wrong(0.5)])
    text = {row.depth: row for row in result.rows}[0].status_text
    assert text.startswith("skipped: every module failed to tune (")
    assert "fake-failing: 1 of 1 graphs failed: build" in text
    assert "fake-wrong(offset=0.5): 1 of 1 graphs rejected: output 0 differs" in text


def depth_zero_status(model: torch.nn.Module, data: list) -> str:
    """The depth-0 row's status after auto_tune with OpenVINO, ONNX Runtime and eager."""
    backends = [tt.backends.OpenVINO(), tt.backends.OnnxRuntime(), tt.backends.Eager()]
    result = tt.auto_tune(
        model,
        data,
        max_depth=0,
        strategy=tt.HighestThroughputStrategy(backends),
        measure_config=tt.MeasureConfig.quick(),
        time_budget=None,
        verbose=False,
        cache=False,
    )
    return result.rows[0].status_text


@pytest.mark.slow
def test_funnel_says_why_no_backend_serves_it() -> None:
    """A family left untuned (Funnel: pooling between blocks) says why in its depth row."""
    transformers = pytest.importorskip("transformers")
    config = transformers.FunnelConfig(
        vocab_size=100, block_sizes=[1, 1], d_model=32, n_head=2, d_head=16, d_inner=64,
        num_decoder_layers=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.FunnelModel(config).eval()
    data = [
        {"input_ids": torch.randint(0, 100, (1, n)), "attention_mask": torch.ones(1, n).long()}
        for n in (8, 12, 16)
    ]
    text = depth_zero_status(model, data)
    assert text.startswith("no change: every graph kept eager: ")
    assert "openvino: 1 of 1 graphs failed: build: ValueDependentError" in text
    assert "pooling_flag" in text  # the line of modeling_funnel.py that branches on a value
    assert "onnxruntime: 1 of 1 graphs failed: build: BackendError: the ONNX export fixed" in text


@pytest.mark.slow
def test_canine_says_why_no_backend_serves_it() -> None:
    """CANINE (character downsampling, chunked local attention) left untuned says why per
    backend in its depth row: each exporter meets the Python loop over the sequence's chunks."""
    transformers = pytest.importorskip("transformers")
    config = transformers.CanineConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        num_hash_functions=4, num_hash_buckets=64, local_transformer_stride=4,
        downsampling_rate=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.CanineModel(config).eval()
    data = [
        {"input_ids": torch.randint(0, 1000, (b, n)), "attention_mask": torch.ones(b, n).long()}
        for b, n in ((2, 32), (3, 48), (2, 40))
    ]
    text = depth_zero_status(model, data)
    assert text.startswith("no change: every graph kept eager: "), text
    # its local attention loops over chunks of the sequence in Python
    assert "openvino: 1 of 1 graphs failed: build: ValueDependentError" in text
    assert "chunk_end = min(from_seq_length" in text
    assert "onnxruntime: 1 of 1 graphs failed: build: BackendError: the ONNX export fixed" in text
