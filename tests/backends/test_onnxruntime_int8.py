"""ONNX Runtime with dynamic int8 quantization: really quantized, close to eager within its
own tolerances, opt-in only, save/load through a checkpoint, hostile saved configs refused,
CPU only, ranged graphs, and a root logger left as it was."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tunetree.backends import (
    OnnxRuntime,
    OnnxRuntimeInt8,
    backend_type,
    default_backends,
)
from tunetree.backends.onnxruntime import OnnxRuntimeRunner
from tunetree.backends.onnxruntime_int8 import quantized_nodes
from tunetree.backends.registry import BUILTIN_BACKENDS
from tunetree.errors import BackendError, InvalidInputError, TunetreeError, UntrustedConfigError
from tunetree.runtime.artifacts import BackendRecord
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.compare import compare_all
from tunetree.signature.graph import Graph, Sample

from .export_models import CPU, graph_of, hide_packages, mlp, run_all
from .test_ranges import mlp_graph, unrecorded

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytest.importorskip("onnx")


def encoder_layer() -> tuple[nn.Module, list[Sample]]:
    """One transformer encoder layer, d 32: attention, feed-forward, layer norms."""
    torch.manual_seed(0)
    module = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True).eval()
    return module, [Sample((torch.randn(2, 8, 32),)) for _ in range(2)]


def max_abs_diff(a: list[Any], b: list[Any]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("model", ["mlp", "encoder_layer"])
def test_quantizes_and_stays_within_its_tolerances(model: str) -> None:
    module, samples = mlp() if model == "mlp" else encoder_layer()
    graph = graph_of(module, samples)
    backend = OnnxRuntimeInt8()
    runner = backend.build(module, graph, CPU)
    assert isinstance(runner, OnnxRuntimeRunner)
    outputs = run_all(runner, graph)
    result = compare_all(graph.outputs, outputs, backend.tolerances())
    assert result.ok, result.reason
    assert max_abs_diff(graph.outputs, outputs) > 1e-6  # not the float model
    # The session's model file is the quantized one, and it is the only model there.
    nodes = quantized_nodes(runner.directory / "model.onnx")
    assert nodes.get("MatMulInteger", 0) >= 2 and nodes.get("DynamicQuantizeLinear", 0) >= 1
    assert set(os.listdir(runner.directory)) <= {"model.onnx", "model.onnx.data"}


def test_opt_in_config_and_registration() -> None:
    assert OnnxRuntimeInt8 in BUILTIN_BACKENDS
    assert backend_type("onnxruntime-int8") is OnnxRuntimeInt8
    assert not OnnxRuntimeInt8.preserves_results and OnnxRuntime.preserves_results
    assert OnnxRuntimeInt8.extra == "onnx"
    assert isinstance(tt.backends.OnnxRuntimeInt8(), tt.backends.ChangesResults)
    assert OnnxRuntimeInt8().tolerances() == tt.Tolerances.uniform(0.1, 0.1)
    backend = OnnxRuntimeInt8(per_channel=True, op_types=["MatMul"], atol=0.2)  # type: ignore[arg-type]
    assert backend.op_types == ("MatMul",)
    assert backend.name == "onnxruntime-int8(atol=0.2, per_channel=True, op_types=('MatMul',))"
    assert OnnxRuntimeInt8(**backend.config()) == backend
    OnnxRuntimeInt8.check_saved_config(backend.config())
    for bad in (
        {"weight_type": "int4"},
        {"op_types": ("Softmax",)},
        {"op_types": ()},
        {"per_channel": "yes"},
        {"atol": -1.0},
        {"graph_optimization_level": "max"},
    ):
        with pytest.raises(InvalidInputError):
            OnnxRuntimeInt8(**bad)
    assert not any(isinstance(b, OnnxRuntimeInt8) for b in default_backends(CPU))
    strategy = tt.default_strategy("cpu")
    assert not any(isinstance(b, OnnxRuntimeInt8) for b in strategy.backends)


@pytest.mark.parametrize(
    "change",
    [
        {"weight_type": "int4"},
        {"weight_type": "QInt8"},
        {"per_channel": "true"},
        {"per_channel": 1},
        {"reduce_range": "auto"},
        {"op_types": ["MatMul", "MyCustomOp"]},
        {"op_types": "MatMul"},
        {"op_types": []},
        {"op_types": [["MatMul"]]},
        {"atol": "0.1"},
        {"rtol": float("nan")},
        {"nodes_to_quantize": ["a"]},
        {"providers": ["/tmp/libevil.so"]},
    ],
    ids=str,
)
def test_hostile_saved_config_is_refused(change: dict[str, Any]) -> None:
    config = {**OnnxRuntimeInt8().config(), **change}
    with pytest.raises(UntrustedConfigError) as caught:
        OnnxRuntimeInt8.check_saved_config(config)
    assert isinstance(caught.value, TunetreeError)
    with pytest.raises(UntrustedConfigError):
        BackendRecord("onnxruntime-int8", config).backend()


def test_weights_take_seven_bits_by_default_only_on_cpus_without_vnni(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for vnni in (True, False):
        monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda v=vnni: v, raising=False)
        assert OnnxRuntimeInt8().reduces_range() is (not vnni)
        assert OnnxRuntimeInt8(reduce_range=True).reduces_range()
        assert not OnnxRuntimeInt8(reduce_range=False).reduces_range()
    monkeypatch.delattr(torch.cpu, "_is_vnni_supported")
    assert OnnxRuntimeInt8().reduces_range()  # unknown: the safe side
    OnnxRuntimeInt8.check_saved_config(OnnxRuntimeInt8().config())  # None is a saved choice


def test_cpu_only_and_missing_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OnnxRuntimeInt8().unavailable_reason(CPU) is None
    for device in ("meta", "cuda"):
        reason = OnnxRuntimeInt8().unavailable_reason(torch.device(device))
        assert reason is not None and "CPU only" in reason and repr(device) in reason
    monkeypatch.setitem(sys.modules, "onnxruntime.quantization", None)
    reason = OnnxRuntimeInt8().unavailable_reason(CPU)
    assert reason is not None and "onnxruntime.quantization" in reason
    assert "pip install 'tunetree[onnx]'" in reason
    monkeypatch.delitem(sys.modules, "onnxruntime.quantization")
    hide_packages(monkeypatch, "onnx")
    reason = OnnxRuntimeInt8().unavailable_reason(CPU)
    assert reason == "onnx is not installed: pip install 'tunetree[onnx]'"


def test_op_types_that_quantize_nothing_fail_the_build() -> None:
    # ONNX Runtime's dynamic mode rewrites Gemm as MatMul: "Gemm" alone matches no node.
    module, samples = mlp(width=32, depth=1)
    with pytest.raises(BackendError, match="quantized no node"):
        OnnxRuntimeInt8(op_types=("Gemm",)).build(module, graph_of(module, samples), CPU)


def runners_of(model: nn.Module) -> list[Any]:
    found = []
    for module in model.modules():
        dispatcher = dispatcher_of(module)
        if dispatcher is not None:
            found += list(dispatcher.runners.values())
    return found


def quick_tune(model: nn.Module, data: list[Any]) -> tt.TuneResult:
    return tt.tune(
        model,
        data,
        strategy=tt.OneBackendStrategy(OnnxRuntimeInt8()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )


def test_checkpoint_round_trip_holds_the_quantized_model(tmp_path: Path) -> None:
    module, samples = mlp()
    data = [s.args[0] for s in samples]
    result = quick_tune(module, data)
    (runner,) = runners_of(result.model)
    assert isinstance(runner.backend, OnnxRuntimeInt8)
    with torch.no_grad():
        before = [result.model(x) for x in data]
        eager = [module(x) for x in data]
    assert max_abs_diff(before, eager) > 1e-6
    path = tt.save(result.model, tmp_path / "int8.tt")
    fresh, _ = mlp()
    loaded = tt.load(fresh, path)  # the saved config passes check_saved_config
    (loaded_runner,) = runners_of(loaded)
    assert isinstance(loaded_runner.backend, OnnxRuntimeInt8)
    assert quantized_nodes(loaded_runner.directory / "model.onnx").get("MatMulInteger", 0) == 4
    with torch.no_grad():
        after = [loaded(x) for x in data]
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b)


def test_a_tuned_range_serves_an_unseen_batch() -> None:
    module, _ = mlp(width=64, depth=2)
    torch.manual_seed(1)
    data = [torch.randn(batch, 64) for batch in (1, 4, 16)]
    result = quick_tune(module, data)
    (runner,) = runners_of(result.model)
    assert runner.dynamic
    unseen = torch.randn(7, 64)
    with torch.no_grad():
        got, eager = result.model(unseen), module(unseen)
    assert got.shape == (7, 64)
    assert not torch.equal(got, eager)  # served by the quantized runner, not the fallback
    assert torch.allclose(got, eager, atol=0.1, rtol=0.1)


def test_a_ranged_graph_survives_save_load(tmp_path: Path) -> None:
    module, graph = mlp_graph()
    backend = OnnxRuntimeInt8()
    runner = backend.build(module, graph, CPU)
    loaded = backend.load(module, graph.key, tmp_path, runner.save(tmp_path), CPU)
    calls = [*graph.samples, *unrecorded(graph)]
    with torch.no_grad():
        eager = [module(*s.args) for s in calls]
        got = [runner(*s.args) for s in calls]
        again = [loaded(*s.args) for s in calls]
    assert compare_all(eager, got, backend.tolerances()).ok
    for a, b in zip(got, again, strict=True):
        assert torch.equal(a, b)


def test_the_root_logger_is_left_as_it_was(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture
) -> None:
    """ONNX Runtime's quantizer logs through ``logging.warning``, which configures a root
    logger that has no handler (basicConfig): nothing may be configured, nothing printed."""
    module, samples = mlp(width=32, depth=1)
    graph: Graph = graph_of(module, samples)
    with caplog.at_level(logging.INFO):
        OnnxRuntimeInt8().build(module, graph, CPU)
    assert not [r for r in caplog.records if "onnxruntime" in r.pathname]
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    filters = list(root.filters)
    OnnxRuntimeInt8().build(module, graph, CPU)
    assert root.handlers == [] and root.filters == filters
    out, err = capfd.readouterr()
    assert "pre-processing" not in out + err
