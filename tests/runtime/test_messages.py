"""What a tuned model says when a call runs the original forward: a graph tuned but left without
a runner says so and why (not "was not seen while tuning"), and a call outside a tuned range names
the tensor and the axis that differ, even where the key's text elides them."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import Delayed, _FnRunner, mlp
from tunetree.backends.base import Backend, Runner
from tunetree.runtime.messages import leaf_labels, outside_range
from tunetree.signature.binding import original_forward
from tunetree.signature.graph import Graph, GraphKey

transformers = pytest.importorskip("transformers")

LOGGER = "tunetree.runtime.wrap"


@dataclasses.dataclass(frozen=True)
class NarrowOnly(Backend):
    """Builds graphs whose batch is at most 4; refuses wider ones while building."""

    kind: ClassVar[str] = "fake-narrow-only"

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        if graph.samples[0].args[0].shape[0] > 4:
            raise RuntimeError("cannot convert: SequenceMark")
        return _FnRunner(self, original_forward(module))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_tuned_graph_left_without_a_runner_says_why(caplog: pytest.LogCaptureFixture) -> None:
    model = mlp()
    data = [torch.randn(4, 16), torch.randn(7, 16)]
    result = tt.tune(
        model,
        data,
        depth=0,
        strategy=tt.OneBackendStrategy(NarrowOnly()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
        dynamic_shapes=False,
    )
    assert len(result.graphs) == 2 and len(result.plan.entries) == 1
    with caplog.at_level(logging.WARNING, logger=LOGGER), torch.no_grad():
        result.model(data[1])  # a call the tuning made itself
        result.model(data[1])
        result.model(torch.randn(9, 16))  # one it never made
    said = warnings_of(caplog)
    tuned = [m for m in said if "was tuned, but no candidate serves it" in m]
    assert len(tuned) == 1  # once per graph
    assert "f32[7,16]" in tuned[0]
    assert "fake-narrow-only failed: build: RuntimeError: cannot convert: SequenceMark" in tuned[0]
    assert not any("f32[7,16]" in m and "was not seen while tuning" in m for m in said)
    assert any("f32[9,16]" in m and "was not seen while tuning" in m for m in said)


class Layers(nn.Module):
    """Reads a cache of three layers whose last one varies in length."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, past_key_values: Any) -> torch.Tensor:
        total = sum(layer.keys.sum() for layer in past_key_values.layers)
        return self.lin(x) + total


def three_layers(last: int) -> Any:
    cache = transformers.DynamicCache()
    for layer, length in enumerate((2, 2, last)):
        cache.update(torch.ones(1, 1, length, 4), torch.ones(1, 1, length, 4), layer)
    return cache


def test_outside_the_range_names_the_elided_axis(caplog: pytest.LogCaptureFixture) -> None:
    model = Layers().eval()
    data = [{"x": torch.randn(1, 4), "past_key_values": three_layers(n)} for n in (3, 5)]
    result = tt.tune(
        model,
        data,
        depth=0,
        strategy=tt.OneBackendStrategy(Delayed(0.0)),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    (entry,) = result.plan.entries
    assert entry.key.is_dynamic
    with caplog.at_level(logging.WARNING, logger=LOGGER), torch.no_grad():
        result.model(torch.randn(1, 4), three_layers(9))
    (said,) = [m for m in warnings_of(caplog) if "outside the tuned range" in m]
    # The key's text shows the first two tensors of the cache only: the same on both sides.
    call = str(GraphKey.of((torch.randn(1, 4), three_layers(9)), {}))
    assert call.count("f32[1,1,2,4]") == 2 and "9" not in call.split("tensors:")[1]
    assert "argument 1 tensor 4 (f32[1,1,9,4]) axis 2 is 9, outside" in said
    assert "3..5" in said.split("axis 2 is 9")[1]


def test_outside_range_phrases() -> None:
    exact = GraphKey.of((torch.zeros(2, 9), torch.zeros(2, 3)), {"mask": torch.zeros(2, 9)})
    assert leaf_labels(exact) == ["argument 0", "argument 1", "mask"]
    seq = tt.Dim("s", 1, 8)
    ranged = dataclasses.replace(
        exact,
        args=tuple(
            dataclasses.replace(a, shape=(2, seq)) if i == 0 else a
            for i, a in enumerate(exact.args)
        ),
        kwargs=tuple((k, dataclasses.replace(v, shape=(2, seq))) for k, v in exact.kwargs),
    )
    assert outside_range(ranged, exact) == "argument 0 (f32[2,9]) axis 1 is 9, outside s 1..8"
    inside = GraphKey.of((torch.zeros(2, 6), torch.zeros(2, 3)), {"mask": torch.zeros(2, 5)})
    assert outside_range(ranged, inside) == (
        "mask (f32[2,5]) axis 1 is 5, but argument 0 axis 1 is 6 (both are s when tuned)"
    )
    wider = GraphKey.of((torch.zeros(2, 6), torch.zeros(3, 3)), {"mask": torch.zeros(2, 6)})
    assert outside_range(ranged, wider) == "argument 1 (f32[3,3]) axis 0 is 3, tuned with 2 only"
    fine = GraphKey.of((torch.zeros(2, 6), torch.zeros(2, 3)), {"mask": torch.zeros(2, 6)})
    assert outside_range(ranged, fine) == ""
