"""A remembered call signature is served by its capture's replay with no checks around it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import mlp
from tests.fakes import quick_tune as tune
from tests.replay_graphs import (
    OpGraph,
    op_graphs,  # noqa: F401 (a fixture)
)
from tunetree.backends.device_graph import DeviceGraphRunner
from tunetree.backends.direct_replay import DirectReplay
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.binding import call_signature
from tunetree.signature.graph import Sample


class TwoInputs(nn.Module):
    """Two tensors, one passed by keyword, and a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.proj(x) * scale + bias


def _served(dispatcher: object) -> list[object]:
    return [served for served, _ in dispatcher._by_signature.values()]  # type: ignore[attr-defined]


@pytest.mark.usefixtures("op_graphs")
def test_repeated_calls_are_replayed_directly_with_eagers_results() -> None:
    model = TwoInputs().eval()
    calls = [((torch.randn(4, 8),), {"bias": torch.randn(8), "scale": 2.0})]
    result = tune(model, [Sample(a, k) for a, k in calls], [tt.backends.DeviceGraph()], depth=0)
    dispatcher = dispatcher_of(result.model)
    assert dispatcher is not None
    with torch.no_grad():
        for _ in range(3):  # the first call learns the signature, the next ones go direct
            x, bias = torch.randn(4, 8), torch.randn(8)
            out = result.model(x, bias=bias, scale=2.0)
            assert torch.allclose(out, model(x, bias=bias, scale=2.0), atol=1e-6)
    (served,) = _served(dispatcher)
    assert isinstance(served, DirectReplay)
    assert isinstance(served.capture, DeviceGraphRunner)
    replays = OpGraph.replays
    with torch.no_grad():
        first = result.model(x, bias=bias, scale=2.0)
        second = result.model(x, bias=bias, scale=2.0)
    assert OpGraph.replays == replays + 2
    assert first is not second and first.data_ptr() != second.data_ptr()  # clones, not the buffer
    assert dispatcher.fallback_calls == 0


@pytest.mark.usefixtures("op_graphs")
def test_another_dtype_or_constant_is_not_served_by_the_direct_replay() -> None:
    model = TwoInputs().eval()
    result = tune(
        model,
        [Sample((torch.randn(4, 8),), {"bias": torch.randn(8), "scale": 2.0})],
        [tt.backends.DeviceGraph()],
        depth=0,
    )
    dispatcher = dispatcher_of(result.model)
    assert dispatcher is not None
    x, bias = torch.randn(4, 8), torch.randn(8)
    with torch.no_grad():
        result.model(x, bias=bias, scale=2.0)
        # Another constant and another dtype are other signatures: the original forward, with
        # eager's own error for float64 inputs (a replay would have copied them into its
        # float32 buffers and answered).
        assert torch.allclose(result.model(x, bias=bias, scale=3.0), model(x, bias=bias, scale=3.0))
        with pytest.raises(RuntimeError, match="same dtype"):
            result.model(x.double(), bias=bias.double(), scale=2.0)
    assert dispatcher.fallback_calls == 2


@pytest.mark.usefixtures("op_graphs")
def test_a_capture_that_moves_cache_positions_keeps_its_checks() -> None:
    """A capture with positions to advance (a decode step) is never replayed directly."""
    model = mlp()
    result = tune(model, [torch.randn(4, 16)], [tt.backends.DeviceGraph()], depth=0)
    dispatcher = dispatcher_of(result.model)
    assert dispatcher is not None
    (runner,) = dispatcher.runners.values()
    capture = runner
    if not isinstance(capture, DeviceGraphRunner):  # a ranged graph's set of captures
        capture = next(iter(runner.captures.values()))
    x = torch.randn(4, 16)
    assert isinstance(capture.for_call((x,), {}), DirectReplay)
    capture.advances = [(0, "position", 1)]
    assert capture.for_call((x,), {}) is capture
    capture.advances = []
    assert capture.for_call((x, x), {}) is capture  # not the captured call's structure


def test_a_call_of_tensors_alone_never_asks_which_objects_runners_own() -> None:
    asked = []

    def owned() -> frozenset[int]:
        asked.append(1)
        return frozenset()

    x = torch.randn(2, 3)
    assert call_signature((x,), {"y": x}, owned) == call_signature((x,), {"y": x})
    assert asked == []
    assert call_signature((x, 2.0), {"flag": True}, owned) is not None
    assert asked == [1]  # asked once, at the first value that is not a tensor


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_direct_replays_on_a_gpu_give_eagers_results_in_outputs_of_their_own() -> None:
    cuda = torch.device("cuda")
    model = mlp().to(cuda)
    data = [torch.randn(b, 16, device=cuda) for b in (2, 8)]
    result = tune(model, data, [tt.backends.DeviceGraph()], depth=0, device=cuda)
    dispatcher = dispatcher_of(result.model)
    assert dispatcher is not None
    with torch.no_grad():
        xs = [torch.randn(b, 16, device=cuda) for b in (2, 8, 2, 8, 2)]
        outs = [result.model(x) for x in xs]  # each output must survive the later replays
        for x, out in zip(xs, outs, strict=True):
            torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert all(isinstance(s, DirectReplay) for s in _served(dispatcher))
    assert dispatcher.fallback_calls == 0
