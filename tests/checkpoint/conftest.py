"""Checkpoints tuned once per test session for the hostile-file tests (issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tunetree as tt
from tests.checkpoint.fixtures.make_fixtures import inputs, model


def _tuned(directory: Path, backend: tt.backends.Backend) -> Path:
    result = tt.tune(
        model(),
        inputs(),
        strategy=tt.OneBackendStrategy(backend),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    assert result.plan.entries[0].backend.kind == backend.kind, result.table()
    path = directory / f"{backend.kind}.tt"
    tt.save(result, path)
    return path


@pytest.fixture(scope="session")
def onnx_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's model tuned whole with ONNX Runtime (one runner, an ONNX model)."""
    pytest.importorskip("onnxruntime")
    return _tuned(tmp_path_factory.mktemp("onnx"), tt.backends.OnnxRuntime())


@pytest.fixture(scope="session")
def int8_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's model tuned whole with ONNX Runtime int8 (MatMulInteger nodes)."""
    pytest.importorskip("onnxruntime.quantization")
    return _tuned(tmp_path_factory.mktemp("int8"), tt.backends.OnnxRuntimeInt8())
