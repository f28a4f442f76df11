"""The demo (``make demo``): its checks compare with the untuned model's outputs, also when the
selected depth wraps the model itself in place (depth >= 1), and its second tune starts from
the untuned model."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import tunetree as tt
from tunetree import demo
from tunetree.backends.base import Backend, Runner
from tunetree.signature.graph import Graph

from .fakes import _FnRunner, spin


class _SpinningLinear(nn.Module):
    """A linear layer that spins 2 ms first: a child a fake backend makes faster."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spin(0.002)
        return self.lin(x)


@dataclasses.dataclass(frozen=True)
class _SkipSpin(Backend):
    """Serves a :class:`_SpinningLinear` without its spin; refuses other modules, so only
    depth 1, which wraps the model in place, can win."""

    kind: ClassVar[str] = "fake-skip-spin"

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        if not isinstance(module, _SpinningLinear):
            raise RuntimeError("only spinning linears")
        lin = module.lin
        return _FnRunner(self, lin)


def _small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(_SpinningLinear(256), _SpinningLinear(256)).eval()


def _fake_auto_tune(model: Any, data: Any, **kwargs: Any) -> tt.AutoTuneResult:
    """The real auto_tune, with the fake backend, quick measurements and no cache."""
    kwargs.update(
        strategy=tt.OneBackendStrategy(_SkipSpin()), cache=False, verbose=False, quick=True
    )
    return tt.auto_tune(model, data, **kwargs)


def test_the_demo_passes_when_depth_one_wraps_the_model_in_place(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo exited 2 in a fresh clone where depth 1 won: the second auto_tune refused the
    model the first had wrapped in place, and both checks compared the tuned model with itself.
    """
    model = _small_model()
    monkeypatch.setattr(demo, "build_encoder", lambda: model)
    monkeypatch.setattr(demo, "auto_tune", _fake_auto_tune)
    assert demo.run_demo(time_budget=None) == 0
    out = capsys.readouterr().out
    assert "tuned outputs vs untuned: match" in out
    assert "Candidates at the selected depth 1" in out
    assert "within the budget" in out


def test_the_demo_compares_with_outputs_taken_before_tuning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tuned model whose outputs moved fails the demo's check, also when the tune wrapped
    the model in place (comparing the model with itself would have passed)."""
    model = _small_model()

    def tune_then_drift(data: Any, **kwargs: Any) -> tt.AutoTuneResult:
        result = _fake_auto_tune(model, data, **kwargs)
        with torch.no_grad():
            model[1].lin.bias.add_(1.0)  # stands in for a tune that changed the results
        return result

    monkeypatch.setattr(demo, "build_encoder", lambda: model)
    monkeypatch.setattr(demo, "auto_tune", lambda _model, data, **kw: tune_then_drift(data, **kw))
    assert demo.run_demo(time_budget=None, accuracy=0) == 1
    assert "tuned outputs vs untuned: match" not in capsys.readouterr().out
