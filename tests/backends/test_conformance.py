"""What every built-in backend must do, run over every one the registry knows: say why it
cannot run on the CPU, or build a runner on a small MLP that matches eager within the
backend's own tolerances, keeps the module's parameters, writes only where told, and
round-trips through save/load with its JSON record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tunetree.backends import Backend, DeviceGraph, registered_backends
from tunetree.signature.compare import compare_all

from .export_models import (
    CPU,
    assert_parameters_untouched,
    graph_of,
    mlp,
    parameter_snapshot,
    run_all,
)

BUILTIN_KINDS = (
    "eager",
    "inductor",
    "device-graph",
    "autocast",
    "torchao",
    "openvino",
    "openvino-bf16",
    "onnxruntime",
    "onnxruntime-int8",
    "tf32",
)
SLOW_KINDS = {"inductor"}  # a real compile; tests/backends/test_inductor.py covers it fast


def _builtins() -> list[type[Backend]]:
    return [cls for cls in registered_backends() if cls.__module__.startswith("tunetree.")]


def test_every_builtin_is_registered() -> None:
    assert sorted(cls.kind for cls in _builtins()) == sorted(BUILTIN_KINDS)


def test_device_graph_needs_a_gpu_on_cpu() -> None:
    reason = DeviceGraph().unavailable_reason(CPU)
    assert isinstance(reason, str) and "CUDA" in reason


@pytest.mark.parametrize(
    "kind",
    [pytest.param(k, marks=pytest.mark.slow) if k in SLOW_KINDS else k for k in BUILTIN_KINDS],
)
def test_backend_conformance(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (cls,) = [c for c in _builtins() if c.kind == kind]
    backend = cls()
    reason = backend.unavailable_reason(CPU)
    if reason is not None:
        assert isinstance(reason, str) and reason.strip()
        return

    module, samples = mlp(width=16, depth=2, batch=3)
    graph = graph_of(module, samples)
    before = parameter_snapshot(module)
    monkeypatch.chdir(tmp_path)  # nothing may be written to the working directory

    runner = backend.build(module, graph, CPU)
    assert runner.backend is backend
    outputs = run_all(runner, graph)
    result = compare_all(graph.outputs, outputs, backend.tolerances())
    assert result.ok, result.reason
    assert all(type(o) is type(e) for o, e in zip(outputs, graph.outputs, strict=True))

    saved = tmp_path / "saved"
    saved.mkdir()
    record = json.loads(json.dumps(runner.save(saved)))  # the record is JSON data
    assert isinstance(record, dict)
    assert sorted(os.listdir(tmp_path)) == ["saved"]
    if type(backend).load is not Backend.load:
        loaded = backend.load(module, graph.key, saved, record, CPU)
        again = compare_all(graph.outputs, run_all(loaded, graph), backend.tolerances())
        assert again.ok, again.reason

    assert_parameters_untouched(module, before)
    assert not module.training
