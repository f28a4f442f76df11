"""Issue 11 problem 4: equivalent calls bind to one canonical form and share one graph."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import Delayed, quick_tune
from tunetree.signature.binding import Binder


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


def reads_keywords_itself(forward):
    """A decorator like Hugging Face's ``merge_with_config_defaults``.

    It fills ``use_cache`` from a default of its own when the caller did not pass it by keyword and
    passes it on again as a keyword, so a call that gives it by position raises TypeError.
    """

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        kwargs["use_cache"] = kwargs.get("use_cache", self.default_use_cache)
        self.seen.append((len(args), sorted(kwargs)))
        return forward(self, *args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.default_use_cache = True
        self.seen: list = []

    @reads_keywords_itself
    def forward(self, x, mask=None, use_cache=None, scale=1.0):
        out = self.lin(x) * scale
        out = out if mask is None else out * mask
        return out + 1.0 if use_cache else out


def test_call_form_passes_keyword_parameters_by_keyword() -> None:
    binder = Binder(Decorated.forward)
    x, mask = torch.ones(1), torch.zeros(1)
    args, kwargs = binder.bind((x,), {"use_cache": False, "mask": mask})
    assert args == (x, mask, False) and kwargs == {}
    assert binder.call_form(args, kwargs) == ((), {"x": x, "mask": mask, "use_cache": False})
    # arguments the binder filled in with their defaults are not passed on
    assert binder.call_form(*binder.bind((x,), {"scale": 2.0})) == ((), {"x": x, "scale": 2.0})


@pytest.mark.parametrize("depth", [0, 1])
def test_decorated_forwards_get_the_call_as_given_everywhere(depth: int) -> None:
    """The eager candidate, a runner and the fallback outside the range all run the decorated
    forward without a TypeError, and the fallback passes exactly what the user passed."""

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Decorated()

        def forward(self, x, mask=None, use_cache=None):
            return self.inner(x, mask, use_cache=use_cache)

    torch.manual_seed(0)
    model = Outer().eval() if depth else Decorated().eval()
    data = [{"x": torch.randn(b, 4), "mask": torch.ones(b, 4), "use_cache": False} for b in (1, 3)]
    expected = [model(**d) for d in data]
    result = quick_tune(model, data, [Delayed(0.0), tt.backends.Eager()], depth=depth)
    assert all(g.winner is not None for g in result.graphs), result.table()
    decorated = result.model if depth == 0 else result.model.inner
    with torch.no_grad():
        for call, want in zip(data, expected, strict=True):
            assert torch.equal(result.model(**call), want)
        outside = {"x": torch.randn(9, 4), "mask": torch.ones(9, 4), "use_cache": False}
        decorated.seen.clear()
        assert torch.equal(result.model(**outside), model.forward(**outside))
    if depth == 0:  # the fallback passed the keywords the user passed, no positional extras
        assert decorated.seen[0] == (0, ["mask", "use_cache", "x"])
    result.undo()


def test_argument_plans_repeat_the_binding_of_calls_with_the_same_signature() -> None:
    from tunetree.signature.binding import ArgumentPlan, call_signature

    binder = Binder(TwoInputs.forward)
    x, y, x2, y2 = (torch.randn(2, 4) for _ in range(4))
    for call, later in [
        (((x,), {"y": y}), ((x2,), {"y": y2})),
        (((), {"y": y, "x": x}), ((), {"y": y2, "x": x2})),
        (((x, y, 2.0), {"mask": None}), ((x2, y2, 2.0), {"mask": None})),
        (((x, y), {}), ((x2, y2), {})),
    ]:
        plan = ArgumentPlan.learn(call, binder.bind(*call))
        assert plan is not None
        assert call_signature(*call) == call_signature(*later)
        want_args, want_kwargs = binder.bind(*later)
        got_args, got_kwargs = plan.apply(*later)
        assert [a is b for a, b in zip(got_args, want_args, strict=True)] == [True] * len(want_args)
        assert got_kwargs.keys() == want_kwargs.keys()
    # a constant's value is part of the signature, and a tensor passed twice has no plan
    assert call_signature((x, y, 2.0), {}) != call_signature((x, y, 3.0), {})
    assert call_signature((x, y), {}) != call_signature((x, y.double()), {})
    assert ArgumentPlan.learn(((x, x), {}), binder.bind((x, x), {})) is None
    assert call_signature((x, [y]), {}) == call_signature((x2, [y2]), {})
    assert call_signature((x, [y]), {}) != call_signature((x, (y,)), {})
    assert call_signature((x, object()), {}) is None  # opaque objects take the binder every call
    # a dict of tensors by plain keys (masks by layer type) signs like its entries, in its order
    assert call_signature((x, {"full": y}), {}) == call_signature((x2, {"full": y2}), {})
    assert call_signature((x, {"full": y}), {}) != call_signature((x, {"sliding": y}), {})
    assert call_signature((x, {"full": y}), {}) != call_signature((x, {"full": y.double()}), {})
    assert call_signature((x, {"full": object()}), {}) is None
    assert call_signature((x, {(1, 2): y}), {}) is None  # keys other than plain constants
