"""OpenVINO backend: conversion, results equal to eager within tolerance, output structure,
save/load, availability, and the opt-in bf16 variant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tunetree.backends import (
    OpenVINO,
    OpenVINOBf16,
    backend_type,
    default_backends,
)
from tunetree.backends.registry import BUILTIN_BACKENDS
from tunetree.backends.value_dependence import ValueDependentError
from tunetree.errors import BackendError, InvalidInputError
from tunetree.signature.compare import Tolerances, compare_all

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

pytest.importorskip("openvino")


@pytest.mark.parametrize("model", list(MODELS))
def test_matches_eager_and_round_trips(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_conformance(OpenVINO(), model, tmp_path, monkeypatch)


def test_awkward_inputs_and_outputs(tmp_path: Path) -> None:
    module, samples = awkward()
    graph = graph_of(module, samples)
    runner = OpenVINO().build(module, graph, CPU)
    outputs = run_all(runner, graph)
    assert compare_all(graph.outputs, outputs).ok
    assert outputs[0]["count"] == 3 and outputs[0]["none"] is None
    assert type(outputs[0]["nt"]).__name__ == "Pair"
    # Keyword arguments in another order are the same graph.
    sample = samples[0]
    reordered = dict(reversed(list(sample.kwargs.items())))
    assert_same(runner(*sample.args, **reordered), outputs[0])

    # A namedtuple is saved as a named node (never a type to import): load resolves it
    # against the module's own output, learnt by running eager once.
    saved_record = runner.save(tmp_path)
    assert saved_record["outputs"]["spec"] is None
    assert "'named', 'tests.backends.export_models.Pair'" in str(
        saved_record["outputs"]["structure"]
    )
    loaded = OpenVINO().load(module, graph.key, tmp_path, saved_record, CPU)
    for a, b in zip(outputs, run_all(loaded, graph), strict=True):
        assert_same(a, b)


def test_value_dependent_module_fails_the_build_with_the_reason() -> None:
    # torch.export refuses the branch on x.sum(); tracing would bake in the sample's branch.
    module, samples = data_dependent()
    graph = graph_of(module, samples)
    with pytest.raises(ValueDependentError, match=r"depends on input values.*x.sum\(\) > 0"):
        OpenVINO().build(module, graph, CPU)


def test_missing_package_gives_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_packages(monkeypatch, "openvino")
    for backend in (OpenVINO(), OpenVINOBf16()):
        reason = backend.unavailable_reason(CPU)
        assert reason == "openvino is not installed: pip install 'tunetree[openvino]'"


def test_tunetree_imports_without_the_packages() -> None:
    code = (
        "import sys; sys.modules['openvino'] = None; sys.modules['onnxruntime'] = None\n"
        "import tunetree.backends as b\n"
        "print(b.OpenVINO().name, b.OnnxRuntime().name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["openvino", "onnxruntime"]


def test_devices() -> None:
    assert OpenVINO().unavailable_reason(CPU) is None
    reason = OpenVINO().unavailable_reason(torch.device("cuda"))
    assert reason is not None and "CPU" in reason
    assert OpenVINO(device="CPU").unavailable_reason(torch.device("cuda")) is None
    reason = OpenVINO(device="NPU.7").unavailable_reason(CPU)
    assert reason is not None and "not available" in reason
    assert OpenVINO().openvino_device(torch.device("xpu", 1)) == "GPU.1"


def test_config_and_registration() -> None:
    assert OpenVINO in BUILTIN_BACKENDS and OpenVINOBf16 in BUILTIN_BACKENDS
    assert backend_type("openvino") is OpenVINO
    assert backend_type("openvino-bf16") is OpenVINOBf16
    assert OpenVINO.extra == "openvino"
    assert OpenVINO.preserves_results and not OpenVINOBf16.preserves_results
    backend = OpenVINO(num_threads=2, performance_hint="THROUGHPUT")
    assert backend.name == "openvino(performance_hint='THROUGHPUT', num_threads=2)"
    assert OpenVINO(**backend.config()) == backend
    assert backend.compile_config() == {
        "INFERENCE_PRECISION_HINT": "f32",
        "PERFORMANCE_HINT": "THROUGHPUT",
        "INFERENCE_NUM_THREADS": 2,
    }
    bf16 = OpenVINOBf16(atol=0.1)
    assert OpenVINOBf16(**bf16.config()) == bf16
    assert bf16.tolerances() == Tolerances.uniform(0.1, 5e-2)
    with pytest.raises(InvalidInputError, match="OpenVINOBf16"):
        OpenVINO(precision="bf16")
    with pytest.raises(InvalidInputError):
        OpenVINOBf16(precision="f32")
    with pytest.raises(InvalidInputError):
        OpenVINO(performance_hint="FAST")
    assert any(isinstance(b, OpenVINO) for b in default_backends(CPU))
    assert any(isinstance(b, OpenVINO) for b in default_backends(torch.device("xpu")))
    assert not any(isinstance(b, OpenVINOBf16) for b in default_backends(CPU))


def test_bf16_is_rejected_by_default_tolerances() -> None:
    backend = OpenVINOBf16()
    reason = backend.unavailable_reason(CPU)
    if reason is not None:
        pytest.skip(reason)
    module, samples = encoder()
    graph = graph_of(module, samples)
    outputs = run_all(backend.build(module, graph, CPU), graph)
    assert not compare_all(graph.outputs, outputs).ok
    assert compare_all(graph.outputs, outputs, backend.tolerances()).ok


def test_bfloat16_inputs_are_refused() -> None:
    module, samples = mlp()
    module = module.to(torch.bfloat16)
    samples = [type(s)((s.args[0].to(torch.bfloat16),)) for s in samples]
    graph = graph_of(module, samples)
    with pytest.raises(BackendError, match="bfloat16"):
        OpenVINO().build(module, graph, CPU)


def test_bad_saved_record_is_a_backend_error(tmp_path: Path) -> None:
    module, samples = mlp()
    graph = graph_of(module, samples)
    with pytest.raises(BackendError):
        OpenVINO().load(module, graph.key, tmp_path, {"model": "model.xml"}, CPU)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["encoder", "bert"])
def test_full_size_models_match_eager(model: str) -> None:
    module, samples = (
        encoder(d=256, seq=128, batch=8) if model == "encoder" else bert(256, 4, 8, 128)
    )
    graph = graph_of(module, samples)
    result = compare_all(graph.outputs, run_all(OpenVINO().build(module, graph, CPU), graph))
    assert result.ok, result.reason


def test_openvino_bf16_is_a_results_changing_backend_like_the_others() -> None:
    from tunetree.backends.base import ChangesResults

    bf16 = OpenVINOBf16(atol=0.2, rtol=0.1)
    assert isinstance(bf16, ChangesResults) and not bf16.preserves_results
    assert bf16.tolerances() == Tolerances.uniform(0.2, 0.1)
    assert OpenVINOBf16().config() == {
        "atol": 0.05,
        "rtol": 0.05,
        "device": None,
        "precision": "bf16",
        "performance_hint": "LATENCY",
        "num_streams": None,
        "num_threads": None,
    }


def test_the_constructor_and_a_saved_config_accept_the_same_hints() -> None:
    from tunetree.backends import openvino as ov
    from tunetree.errors import UntrustedConfigError

    for hint in ov._HINTS:
        OpenVINO(performance_hint=hint)
        OpenVINO.check_saved_config({"performance_hint": hint})
    with pytest.raises(InvalidInputError, match="LATENCY, THROUGHPUT, CUMULATIVE_THROUGHPUT"):
        OpenVINO(performance_hint="FASTEST")
    with pytest.raises(UntrustedConfigError):
        OpenVINO.check_saved_config({"performance_hint": "FASTEST"})
