"""ONNX Runtime backend: dynamo export, results equal to eager within tolerance, output
structure, save/load, session options and availability."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tunetree.backends import (
    OnnxRuntime,
    backend_type,
    default_backends,
)
from tunetree.backends.onnxruntime import OnnxRuntimeRunner
from tunetree.backends.registry import BUILTIN_BACKENDS
from tunetree.backends.value_dependence import ValueDependentError
from tunetree.errors import BackendError, InvalidInputError
from tunetree.signature.compare import compare_all

from .export_models import (
    CPU,
    MODELS,
    assert_same,
    awkward,
    bert,
    check_conformance,
    data_dependent,
    encoder,
    graph_of,
    hide_packages,
    mlp,
    run_all,
)

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.mark.parametrize("model", list(MODELS))
def test_matches_eager_and_round_trips(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, saved = check_conformance(OnnxRuntime(), model, tmp_path, monkeypatch)
    assert "model.onnx" in os.listdir(saved)


def test_awkward_inputs_and_outputs(tmp_path: Path) -> None:
    module, samples = awkward()
    graph = graph_of(module, samples)
    runner = OnnxRuntime().build(module, graph, CPU)
    assert isinstance(runner, OnnxRuntimeRunner)
    # Tensor kwargs become named ONNX inputs; the float and the nested dict are baked in.
    assert sorted(name for name, _ in runner.feeds) == ["arg0", "ids", "mask"]
    outputs = run_all(runner, graph)
    assert compare_all(graph.outputs, outputs).ok
    assert outputs[0]["count"] == 3 and outputs[0]["none"] is None
    assert outputs[0]["nt"].index.dtype == torch.int64
    sample = samples[0]
    reordered = dict(reversed(list(sample.kwargs.items())))
    assert_same(runner(*sample.args, **reordered), outputs[0])

    saved_record = runner.save(tmp_path)
    loaded = OnnxRuntime().load(module, graph.key, tmp_path, saved_record, CPU)
    for a, b in zip(outputs, run_all(loaded, graph), strict=True):
        assert_same(a, b)


def test_value_dependent_module_fails_the_build_with_the_reason() -> None:
    # torch.export refuses the branch on x.sum(); tracing would bake in the sample's branch.
    module, samples = data_dependent()
    graph = graph_of(module, samples)
    with pytest.raises(ValueDependentError, match=r"depends on input values.*x.sum\(\) > 0"):
        OnnxRuntime().build(module, graph, CPU)


def test_runner_removes_its_directory() -> None:
    module, samples = mlp(width=8, depth=1)
    graph = graph_of(module, samples)
    runner = OnnxRuntime().build(module, graph, CPU)
    assert isinstance(runner, OnnxRuntimeRunner)
    directory = runner.directory
    assert (directory / "model.onnx").is_file()
    del runner
    gc.collect()
    assert not directory.exists()


def test_session_options() -> None:
    options = OnnxRuntime(intra_op_num_threads=1, graph_optimization_level="basic")
    session_options = options.session_options()
    assert session_options.intra_op_num_threads == 1
    assert session_options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert (
        session_options.graph_optimization_level
        == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    )
    spinning = OnnxRuntime(allow_spinning=True).session_options()
    assert spinning.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_missing_package_gives_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_packages(monkeypatch, "onnxruntime")
    reason = OnnxRuntime().unavailable_reason(CPU)
    assert reason == "onnxruntime is not installed: pip install 'tunetree[onnx]'"
    hide_packages(monkeypatch, "onnx", "onnxscript")
    reason = OnnxRuntime().unavailable_reason(CPU)
    assert reason is not None and "onnx, onnxscript" in reason and "tunetree[onnx]" in reason


def test_devices_and_providers() -> None:
    assert OnnxRuntime().unavailable_reason(CPU) is None
    assert OnnxRuntime().provider_names(torch.device("cuda")) == [
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    reason = OnnxRuntime().unavailable_reason(torch.device("xpu"))
    assert reason is not None and "xpu" in reason
    reason = OnnxRuntime(providers=("NoSuchExecutionProvider",)).unavailable_reason(CPU)
    assert reason is not None and "NoSuchExecutionProvider" in reason
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        reason = OnnxRuntime().unavailable_reason(torch.device("cuda"))
        assert reason is not None and "onnxruntime-gpu" in reason


def test_config_and_registration() -> None:
    assert OnnxRuntime in BUILTIN_BACKENDS and backend_type("onnxruntime") is OnnxRuntime
    assert OnnxRuntime.extra == "onnx" and OnnxRuntime.preserves_results
    backend = OnnxRuntime(providers=["CPUExecutionProvider"], inter_op_num_threads=1)  # type: ignore[arg-type]
    assert backend.providers == ("CPUExecutionProvider",)
    assert OnnxRuntime(**backend.config()) == backend
    with pytest.raises(InvalidInputError):
        OnnxRuntime(graph_optimization_level="max")
    cpu_defaults = default_backends(CPU)
    assert any(isinstance(b, OnnxRuntime) for b in cpu_defaults)
    assert any(isinstance(b, OnnxRuntime) for b in default_backends(torch.device("cuda")))


def test_bfloat16_inputs_are_refused() -> None:
    module, samples = mlp()
    module = module.to(torch.bfloat16)
    samples = [type(s)((s.args[0].to(torch.bfloat16),)) for s in samples]
    graph = graph_of(module, samples)
    with pytest.raises(BackendError, match="bfloat16"):
        OnnxRuntime().build(module, graph, CPU)


def test_bad_saved_record_is_a_backend_error(tmp_path: Path) -> None:
    module, samples = mlp()
    graph = graph_of(module, samples)
    with pytest.raises(BackendError):
        OnnxRuntime().load(module, graph.key, tmp_path, {"files": ["model.onnx"]}, CPU)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["encoder", "bert"])
def test_full_size_models_match_eager(model: str) -> None:
    module, samples = (
        encoder(d=256, seq=128, batch=8) if model == "encoder" else bert(256, 4, 8, 128)
    )
    graph = graph_of(module, samples)
    result = compare_all(graph.outputs, run_all(OnnxRuntime().build(module, graph, CPU), graph))
    assert result.ok, result.reason


def test_load_checks_the_record_and_the_model_against_the_graph(tmp_path: Path) -> None:
    """Issue 19: a saved record whose input paths the graph lacks, or a graph whose fixed size
    the ONNX model does not take, is refused at load, not at the first call."""
    from tunetree.signature.graph import GraphKey, TensorSpec

    module, samples = mlp(width=8, depth=1, batch=2)
    graph = graph_of(module, samples)
    saved = OnnxRuntime().build(module, graph, CPU).save(tmp_path)
    bad = {**saved, "inputs": {**saved["inputs"], "paths": [[["i", 0], ["i", 3]]]}}
    with pytest.raises(BackendError, match="input path"):
        OnnxRuntime().load(module, graph.key, tmp_path, bad, CPU)
    wider = GraphKey((TensorSpec("f32", (3, 8)),), ())
    with pytest.raises(BackendError, match="does not fit its graph"):
        OnnxRuntime().load(module, wider, tmp_path, saved, CPU)
    loaded = OnnxRuntime().load(module, graph.key, tmp_path, saved, CPU)
    assert loaded.served is None
    assert compare_all(graph.outputs, run_all(loaded, graph)).ok


def test_no_session_spins_unless_the_user_asks_for_a_dedicated_process() -> None:
    """Spinning threads serve back-to-back calls faster (depth 0), but in a serving process
    something always runs between calls: eager work right after a spinning depth-0 call took
    2.2x its time alone (issue 30). So no tuned session spins, at any depth, until the user
    says the process serves this model only (``tt.serve_alone``), and then only a root runner.
    """
    import tunetree as tt
    from tests.fakes import mlp as mlp_model
    from tunetree.runtime.wrap import dispatcher_of

    def quick_tune(model: torch.nn.Module, data: list[Any], depth: int) -> tt.TuneResult:
        return tt.tune(
            model,
            data,
            depth=depth,
            strategy=tt.OneBackendStrategy(OnnxRuntime()),
            measure_config=tt.MeasureConfig.quick(),
            verbose=False,
            cache=False,
        )

    def runners(model: torch.nn.Module) -> list[Any]:
        found = []
        for module in model.modules():
            dispatcher = dispatcher_of(module)
            if dispatcher is not None:
                found += list(dispatcher.runners.values())
        return found

    def spins(runner: Any) -> str:
        options = runner.session.get_session_options()
        return str(options.get_session_config_entry("session.intra_op.allow_spinning"))

    x = torch.randn(4, 16)
    whole = quick_tune(mlp_model(), [x], depth=0)
    (root,) = runners(whole.model)
    assert not root.spinning and spins(root) == "0"
    inner = quick_tune(mlp_model(), [x], depth=1)
    assert inner.depth == 1 and runners(inner.model)
    assert tt.serve_alone(inner.model) == 0  # not the whole model: nothing told
    assert not any(r.spinning or spins(r) == "1" for r in runners(inner.model))
    assert tt.serve_alone(whole.model) == 1
    assert root.spinning and spins(root) == "1"
    assert torch.allclose(whole.model(x), whole.original(x), atol=1e-5)


class _SizeAsNumber(torch.nn.Module):
    """Reads its input's width as a Python number, as MobileNetV2's TF padding does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * int(x.shape[-1])


def test_an_export_that_fixes_a_ranged_size_fails_the_build_naming_the_axis() -> None:
    """MobileNetV2's ranged graphs were exported with the example's image size and failed as
    "run" errors on the first call of another size; the build now says which axis was fixed."""
    from tunetree.signature.graph import Sample
    from tunetree.signature.shapes import group_graphs

    module = _SizeAsNumber().eval()
    samples = [Sample((torch.randn(2, w),)) for w in (4, 8, 6)]
    with torch.no_grad():
        (graph,) = group_graphs([(s, module(*s.args)) for s in samples]).values()
    assert graph.key.is_dynamic
    with pytest.raises(BackendError, match=r"fixed axis 1 of input 'arg0' to \d+, where the"):
        OnnxRuntime().build(module, graph, CPU)
    fixed = [Sample((torch.randn(2, 8),)), Sample((torch.randn(3, 8),))]
    with torch.no_grad():
        (one_width,) = group_graphs([(s, module(*s.args)) for s in fixed]).values()
    runner = OnnxRuntime().build(module, one_width, CPU)  # the batch axis stays ranged
    with torch.no_grad():
        got = [runner(torch.ones(b, 8)) for b in (1, 5)]
    assert compare_all([module(torch.ones(b, 8)) for b in (1, 5)], got).ok
