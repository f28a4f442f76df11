"""Modules that branch on tensor values: the exporting backends fail the build and say why,
whether torch.export refuses the module or the tracing fallback would bake in one branch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tunetree as tt
from tunetree.backends import Eager, OnnxRuntime, OpenVINO
from tunetree.backends.base import Backend
from tunetree.backends.value_dependence import (
    ValueDependentError,
    data_dependent_reason,
    traced_values_checked,
)
from tunetree.candidates.strategy import MinLatencyStrategy
from tunetree.signature.compare import compare_all

from .export_models import CPU, data_dependent, graph_of, mlp, run_all

EXPORTERS = [OpenVINO(), OnnxRuntime()]


def available(backend: Backend) -> Backend:
    reason = backend.unavailable_reason(CPU)
    if reason is not None:
        pytest.skip(reason)
    return backend


@pytest.fixture
def export_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.export fails for a reason unrelated to values, so the tracing fallback runs."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("unsupported operator for this test")

    monkeypatch.setattr(torch.export, "export", refuse)


@pytest.mark.parametrize("backend", EXPORTERS, ids=str)
def test_export_refusal_names_the_branch(backend: Backend) -> None:
    module, samples = data_dependent()
    with pytest.raises(ValueDependentError) as caught:
        available(backend).build(module, graph_of(module, samples), CPU)
    message = str(caught.value)
    assert message.startswith("the graph depends on input values")
    assert "x.sum() > 0" in message


@pytest.mark.usefixtures("export_refuses")
@pytest.mark.parametrize("backend", EXPORTERS, ids=str)
def test_tracing_fallback_refuses_a_baked_branch(backend: Backend) -> None:
    module, samples = data_dependent()
    with pytest.raises(ValueDependentError, match=r"converted a tensor to a Python boolean") as e:
        available(backend).build(module, graph_of(module, samples), CPU)
    assert "export_models.py" in str(e.value) and "x.sum() > 0" in str(e.value)


@pytest.mark.usefixtures("export_refuses")
@pytest.mark.parametrize("backend", EXPORTERS, ids=str)
def test_tracing_fallback_still_serves_value_independent_modules(backend: Backend) -> None:
    module, samples = mlp(width=8, depth=2)
    graph = graph_of(module, samples)
    runner = available(backend).build(module, graph, CPU)
    assert compare_all(graph.outputs, run_all(runner, graph)).ok


def test_tracer_check_ignores_other_warnings() -> None:
    import warnings

    with traced_values_checked("tracing"):
        warnings.warn("something else entirely", UserWarning, stacklevel=1)
    message = "Converting a tensor to a Python number might cause the trace to be incorrect."
    with (
        pytest.raises(ValueDependentError, match="Python number"),
        traced_values_checked("tracing"),
    ):
        warnings.warn(message, torch.jit.TracerWarning, stacklevel=1)


def test_other_export_errors_are_not_value_dependence() -> None:
    assert data_dependent_reason(RuntimeError("unsupported operator aten::foo")) is None
    wrapped = RuntimeError("export failed")
    wrapped.__cause__ = RuntimeError("Could not guard on data-dependent expression Eq(u0, 1)")
    reason = data_dependent_reason(wrapped)
    assert reason is not None and reason.startswith("the graph depends on input values")


def test_tune_rows_say_what_happened() -> None:
    for backend in EXPORTERS:
        available(backend)
    module, samples = data_dependent()
    # Mixed signs: a runner with one branch baked in would be wrong on half of them.
    data = [s.args[0] * sign for s in samples for sign in (1.0, -1.0)]
    strategy = MinLatencyStrategy([*EXPORTERS, Eager()])
    quick = tt.MeasureConfig(warmup_s=0.01, block_s=0.01, trials=3, max_s_per_candidate=0.2)
    result = tt.tune(
        module, data, strategy=strategy, measure_config=quick, verbose=False, cache=False
    )
    rows = {row.backend.kind: row for g in result.graphs for row in g.rows}
    for kind in ("openvino", "onnxruntime"):
        assert "depends on input values" in rows[kind].describe(), rows[kind].describe()
    table = result.table()
    assert table.count("depends on input values") == 2
    with torch.no_grad():
        for x in data:
            assert torch.equal(result.model(x), module(x))
