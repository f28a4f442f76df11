"""Wrapping: dispatch by graph, fallback on unseen signatures, state_dict/hooks kept, undo."""

from __future__ import annotations

import logging

import pytest
import torch

import tunetree as tt
from tests.fakes import Delayed, Wrong, mlp
from tests.fakes import quick_tune as tune
from tests.replay_graphs import op_graphs  # noqa: F401 (a fixture)
from tunetree.runtime.wrap import dispatcher_of


def test_unseen_signature_falls_back_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    model = mlp()
    result = tune(model, [torch.randn(4, 16)], [Delayed(0.0)], depth=1)
    tuned = result.model
    with caplog.at_level(logging.WARNING, logger="tunetree.runtime.wrap"), torch.no_grad():
        out = tuned(torch.randn(7, 16))
        tuned(torch.randn(7, 16))
    assert out.shape == (7, 16)
    warnings = [r for r in caplog.records if "was not seen while tuning" in r.getMessage()]
    assert len(warnings) == 3  # one per wrapped module (two Linear, one ReLU), not per call


def test_wrapping_keeps_state_dict_hooks_and_can_be_undone() -> None:
    model = mlp()
    keys = list(model.state_dict())
    seen = []
    model[0].register_forward_hook(lambda m, a, o: seen.append(o.shape))
    result = tune(model, [torch.randn(4, 16)], [Delayed(0.0)], depth=1)
    assert result.model is model
    assert dispatcher_of(model[0]) is not None
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        model(torch.randn(4, 16))
    assert seen and seen[-1] == (4, 16)
    assert sorted(tt.unwrap(model)) == ["0", "1", "2"]
    assert all(dispatcher_of(m) is None for m in model.modules())
    with pytest.raises(tt.InvalidInputError, match="already tuned"):
        tune(
            tune(model, [torch.randn(4, 16)], [Delayed(0.0)], depth=1).model,
            [torch.randn(4, 16)],
            [Delayed(0.0)],
        )


def test_result_undo_restores_forward() -> None:
    model = mlp()
    result = tune(model, [torch.randn(4, 16)], [Delayed(0.0)], depth=2)
    assert result.undo() is model
    assert all(dispatcher_of(m) is None for m in model.modules())


def test_training_mode_runs_the_original_forward() -> None:
    model = mlp()
    result = tune(model, [torch.randn(4, 16)], [Wrong(0.5)], depth=0)
    assert result.graphs[0].winner is None  # wrong numbers are never installed
    result = tune(model, [torch.randn(4, 16)], [Delayed(0.0)], depth=0)
    fast = result.model
    calls = []
    fast.forward.runners = {
        k: type(r)(r.backend, lambda *a, **kw: calls.append(1) or model[0](*a, **kw))
        for k, r in fast.forward.runners.items()
    }
    x = torch.randn(4, 16)
    with torch.no_grad():
        fast(x)
        assert calls == [1]
        fast.train()
        assert torch.equal(fast(x), model(x))
        assert calls == [1]  # the runner was not used in training mode
        fast.eval()


def test_ranged_graph_serves_unrecorded_sizes_and_falls_back_outside(caplog) -> None:
    model = mlp()
    torch.manual_seed(0)
    data = [torch.randn(b, 16) for b in (2, 4, 8)]
    result = tune(model, data, [Delayed(0.0)], depth=0)
    dispatcher = result.model.forward
    (key,) = dispatcher.runners
    assert str(key) == "(f32[batch 2..8, 16])"
    served = []
    dispatcher.runners = {
        k: type(r)(r.backend, lambda x, r=r: served.append(x.shape[0]) or r(x))
        for k, r in dispatcher.runners.items()
    }
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tunetree.runtime.wrap"):
        for b in (3, 7, 3):
            assert torch.equal(result.model(torch.ones(b, 16)), model(torch.ones(b, 16)))
        assert served == [3, 7, 3]
        assert not caplog.records
        for b in (1, 9, 20):  # outside batch 2..8: the original forward, logged once
            assert torch.equal(result.model(torch.ones(b, 16)), model(torch.ones(b, 16)))
    assert served == [3, 7, 3]
    (record,) = caplog.records
    assert "outside the tuned range (f32[batch 2..8, 16])" in record.getMessage()


def test_routing_memo_is_bounded(monkeypatch) -> None:
    model = mlp()
    result = tune(model, [torch.randn(b, 16) for b in (1, 64)], [Delayed(0.0)], depth=0)
    dispatcher = result.model.forward
    monkeypatch.setattr("tunetree.runtime.wrap.MEMO_LIMIT", 3)
    with torch.no_grad():
        for b in range(1, 10):
            result.model(torch.ones(b, 16))
    assert len(dispatcher._routes) <= 3


class KeywordModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, scale: float = 1.0):
        out = self.lin(x)
        return (out if y is None else out + y) * scale


def test_repeated_calls_skip_binding_and_keying(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatcher's per-call work (issue 22): after the first call of a signature, keyword
    calls are neither bound again nor keyed again, and they reach the same runner."""
    from tunetree.signature import binding, graph

    model = KeywordModel().eval()
    data = [{"x": torch.randn(4, 16), "y": torch.randn(4, 16)}]
    result = tune(model, data, [Delayed(0.0)], depth=0)
    tuned = result.model
    counts = {"bind": 0, "key": 0}
    bind, key_of = binding.Binder.bind, graph.GraphKey.of.__func__

    def counting_bind(self, args, kwargs):  # type: ignore[no-untyped-def]
        counts["bind"] += 1
        return bind(self, args, kwargs)

    def counting_key(cls, args, kwargs):  # type: ignore[no-untyped-def]
        counts["key"] += 1
        return key_of(cls, args, kwargs)

    monkeypatch.setattr(binding.Binder, "bind", counting_bind)
    monkeypatch.setattr(graph.GraphKey, "of", classmethod(counting_key))
    dispatcher = dispatcher_of(tuned)
    assert dispatcher is not None
    with torch.no_grad():
        for _ in range(5):
            x, y = torch.randn(4, 16), torch.randn(4, 16)
            assert torch.equal(tuned(x=x, y=y), model(x=x, y=y))
        # tune's serving check ran the tuning data through the dispatcher: already routed
        assert counts == {"bind": 0, "key": 0}
        # another constant is another signature, bound and keyed once (then the original)
        x = torch.randn(4, 16)
        assert torch.equal(tuned(x, y=y, scale=2.0), model(x, y=y, scale=2.0))
        assert torch.equal(tuned(x, y=y, scale=2.0), model(x, y=y, scale=2.0))
        assert counts == {"bind": 1, "key": 1}
        # one tensor in two places is bound every time (the next call may pass two)
        assert torch.equal(tuned(x, y=x), model(x, y=x))
        assert torch.equal(tuned(x, y=x), model(x, y=x))
    assert counts["bind"] == 3
    assert dispatcher.fallback_calls == 2


@pytest.mark.usefixtures("op_graphs")
def test_a_remembered_signature_goes_straight_to_its_capture() -> None:
    """A ranged device-graph graph holds one capture per shape; once a call of a signature ran,
    the dispatcher calls that capture itself (issue 30: per-call overhead), with the same
    results, and a new shape still goes through the shape lookup (and is captured)."""
    from tunetree.backends.device_graph import DeviceGraphRunner, ShapeSetRunner
    from tunetree.backends.direct_replay import DirectReplay

    model = mlp()
    data = [torch.randn(b, 16) for b in (2, 4, 8)]
    result = tune(model, data, [tt.backends.DeviceGraph()], depth=0)
    dispatcher = dispatcher_of(result.model)
    assert dispatcher is not None
    (runner,) = dispatcher.runners.values()
    assert isinstance(runner, ShapeSetRunner)
    with torch.no_grad():
        for batch in (4, 4, 6, 6):
            x = torch.randn(batch, 16)
            assert torch.allclose(result.model(x), model(x), atol=1e-6)
    direct = {sig[0][1][0]: served for sig, (served, _) in dispatcher._by_signature.items()}
    # Each signature is served by its capture's replay with no checks around it: the signature
    # (dtype and shape) already says the tensor fits the capture's static buffer.
    assert isinstance(direct[4], DirectReplay) and isinstance(direct[6], DirectReplay)
    assert isinstance(direct[6].capture, DeviceGraphRunner)
    assert direct[6].capture is runner.captures[((6, 16),)]
    assert dispatcher.fallback_calls == 0
