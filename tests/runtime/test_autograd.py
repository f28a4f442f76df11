"""Under grad mode a tuned model keeps autograd: a call whose eager output would carry autograd
history (grad mode on, and a parameter or an input requiring grad) runs the original forward, never
a runner's detached output; under no_grad, inference_mode or with nothing requiring grad the
runners serve as before."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import _FnRunner, mlp
from tunetree.backends.base import Backend, Runner
from tunetree.runtime.wrap import dispatcher_of, wrap
from tunetree.signature.binding import original_forward
from tunetree.signature.graph import Graph

CPU = torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class Detached(Backend):
    """Runs the original forward without autograd, as every real runner does; counts its calls."""

    kind: ClassVar[str] = "fake-detached"
    calls: list = dataclasses.field(default_factory=list, compare=False, repr=False)

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        forward = original_forward(module)

        def run(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(1)
            with torch.no_grad():
                return forward(*args, **kwargs)

        return _FnRunner(self, run)


def tuned_with(backend: Backend, model: nn.Module, data: list[torch.Tensor]) -> nn.Module:
    result = tt.tune(
        model,
        data,
        depth=0,
        strategy=tt.OneBackendStrategy(backend),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    assert result.graphs[0].winner is not None
    assert result.graphs[0].winner.backend.kind == backend.kind, result
    assert dispatcher_of(result.model) is not None
    return result.model


def eager_tuned(model: nn.Module, data: list[torch.Tensor]) -> nn.Module:
    """Eager never wins a wrap on its own (an all-eager path keeps its forward): wrap it by hand."""
    result = tt.tune(
        model, data, depth=0, strategy=tt.OneBackendStrategy(Detached()), verbose=False
    )
    graph = result.graphs[0].graph
    result.undo()
    runner = tt.backends.Eager().build(model, graph, CPU)
    return wrap(model, {"": {graph.key: runner}})


def gradients(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The output (which must carry autograd history) and the gradients of its sum."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    out = model(x)
    assert out.requires_grad and out.grad_fn is not None
    out.sum().backward()
    assert x.grad is not None
    return x.grad, [p.grad.clone() for p in model.parameters() if p.grad is not None]


def check_keeps_autograd(tuned: nn.Module, eager: nn.Module, x: torch.Tensor) -> None:
    with torch.enable_grad():
        got_x, got_params = gradients(tuned, x)
        want_x, want_params = gradients(eager, x)
    torch.testing.assert_close(got_x, want_x)
    assert len(got_params) == len(want_params) == len(list(eager.parameters()))
    for got, want in zip(got_params, want_params, strict=True):
        torch.testing.assert_close(got, want)
    with torch.inference_mode():  # the runner still serves inference
        before = dispatcher_of(tuned).fallback_calls
        torch.testing.assert_close(tuned(x), eager(x))
        assert dispatcher_of(tuned).fallback_calls == before


def backends() -> list[Any]:
    return [
        pytest.param(lambda: tt.backends.OnnxRuntime(), id="onnxruntime"),
        pytest.param(lambda: tt.backends.OpenVINO(), id="openvino"),
        pytest.param(lambda: tt.backends.Inductor(), id="inductor", marks=pytest.mark.slow),
    ]


@pytest.mark.parametrize("make", backends())
def test_each_backend_keeps_autograd_under_grad_mode(make: Any) -> None:
    backend = make()
    if backend.unavailable_reason(CPU):
        pytest.skip(backend.unavailable_reason(CPU))
    model = mlp()
    data = [torch.randn(4, 16) for _ in range(2)]
    check_keeps_autograd(tuned_with(backend, model, data), model, torch.randn(4, 16))


def test_eager_runner_keeps_autograd_under_grad_mode() -> None:
    model = mlp()
    data = [torch.randn(4, 16)]
    check_keeps_autograd(eager_tuned(model, data), model, torch.randn(4, 16))


def test_detached_runner_is_not_used_when_autograd_is_needed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = mlp()
    backend = Detached()
    tuned = tuned_with(backend, model, [torch.randn(4, 16)])
    x = torch.randn(4, 16)
    backend.calls.clear()
    with caplog.at_level(logging.WARNING, logger="tunetree.runtime.wrap"), torch.enable_grad():
        check_keeps_autograd(tuned, model, x)
        tuned(x)
    assert backend.calls == [1]  # only the inference_mode call of the check
    warned = [r for r in caplog.records if "autograd history" in r.getMessage()]
    assert len(warned) == 1  # once per dispatcher, not per call
    assert "torch.inference_mode()" in warned[0].getMessage()


def test_frozen_parameters_serve_the_runner_unless_an_input_requires_grad() -> None:
    model = mlp()
    backend = Detached()
    tuned = tuned_with(backend, model, [torch.randn(4, 16)])
    model.requires_grad_(False)
    x = torch.randn(4, 16)
    backend.calls.clear()
    with torch.enable_grad():
        out = tuned(x)  # nothing requires grad: eager's output has no history either
        assert backend.calls == [1] and not out.requires_grad
        xg = x.clone().requires_grad_(True)
        out = tuned(xg)
        assert backend.calls == [1] and out.requires_grad  # an input requiring grad: original
        out.sum().backward()
        want = x.clone().requires_grad_(True)
        model(want).sum().backward()
        torch.testing.assert_close(xg.grad, want.grad)
        model[2].weight.requires_grad_(True)  # unfrozen after tuning: seen at the next call
        out = tuned(x)
        assert backend.calls == [1] and out.requires_grad


def test_inputs_requiring_grad_are_found_inside_containers() -> None:
    from tunetree.runtime.autograd import requires_grad_inside

    leaf = torch.ones(2, requires_grad=True)
    assert requires_grad_inside(((torch.ones(2),), {"a": [torch.ones(1), {"b": leaf}]}))
    assert not requires_grad_inside(((torch.ones(2),), {"a": [torch.ones(1), 3, "s"]}))


def test_no_grad_and_inference_mode_serve_the_runner_with_parameters_requiring_grad() -> None:
    model = mlp()
    backend = Detached()
    tuned = tuned_with(backend, model, [torch.randn(4, 16)])
    assert all(p.requires_grad for p in model.parameters())
    backend.calls.clear()
    x = torch.randn(4, 16)
    with torch.no_grad():
        tuned(x)
    with torch.inference_mode():
        tuned(x)
    assert backend.calls == [1, 1]
    assert dispatcher_of(tuned).fallback_calls == 0
