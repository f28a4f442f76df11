"""Issue 11 problem 4: equivalent calls bind to one canonical form and share one graph."""

from __future__ import annotations

import torch
from torch import nn

import tunetree as tt
from tests.fakes import Delayed, quick_tune
from tunetree.binding import Binder


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor, scale: float = 1.0, mask=None):
        out = self.lin(x) + y
        return out * scale if mask is None else out * scale * mask


class Root(nn.Module):
    """Calls its child in every equivalent way: a graph per spelling without binding."""

    def __init__(self) -> None:
        super().__init__()
        self.child = TwoInputs()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        a = self.child(x, y)
        b = self.child(x, y=y)
        c = self.child(y=y, x=x)
        d = self.child(x, y, 1.0)
        e = self.child(x, y, mask=None)
        return a + b + c + d + e


def test_equivalent_calls_share_one_graph() -> None:
    info = tt.inspect(Root().eval(), [torch.randn(3, 4)], max_samples_per_graph=8)
    graphs = info.modules["child"].graphs
    assert len(graphs) == 1
    (graph,) = graphs.values()
    assert len(graph.samples) == 5
    assert str(graph.key) == "(f32[3,4], f32[3,4])"


def test_dispatcher_keys_calls_the_same_way() -> None:
    model = Root().eval()
    x = torch.randn(3, 4)
    result = quick_tune(model, [x], [Delayed(0.0)], depth=1)
    dispatcher = result.model.child.forward
    assert len(dispatcher.runners) == 1
    with torch.no_grad():
        assert torch.allclose(result.model(x), Root.forward(model, x))
    # every spelling went to the runner: one routing decision, no fallback
    assert len(dispatcher._routes) == 1
    assert not dispatcher._warned
    result.undo()


class PositionalOnly(nn.Module):
    def forward(self, x, /, *rest, k=3, **extra):
        return x


def test_positional_only_var_args_and_kwargs() -> None:
    binder = Binder(PositionalOnly.forward)
    a, b = torch.ones(1), torch.zeros(1)
    assert binder.bind((a,), {}) == ((a,), {})
    assert binder.bind((a, b), {"k": 3}) == ((a, b), {})
    assert binder.bind((a,), {"k": 4, "z": b}) == ((a,), {"k": 4, "z": b})
    assert binder.names == ["x", "k", "extra"]
    # a call that does not bind is keyed as given (the forward raises its own error)
    assert binder.bind((), {"x": a}) == ((), {"x": a})


def test_defaults_are_dropped_by_value_for_constants() -> None:
    binder = Binder(TwoInputs.forward)
    x, y = torch.ones(2), torch.zeros(2)
    canonical = ((x, y), {})
    assert binder.bind((x,), {"y": y, "scale": 1.0, "mask": None}) == canonical
    assert binder.bind((x, y, 2.0), {}) == ((x, y, 2.0), {})
    assert binder.bind((x, y), {"mask": y}) == ((x, y, 1.0, y), {})


def test_a_forward_without_self_is_keyed_as_called() -> None:
    def wrapper(*args, **kwargs):
        return args

    binder = Binder(wrapper)
    a = torch.ones(1)
    assert binder.signature is None
    assert binder.bind((a,), {"k": 1}) == ((a,), {"k": 1})
