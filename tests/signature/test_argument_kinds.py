"""Issue 31, item 2: every argument kind keys as eager sees it, and no table reports a graph
that its dispatcher never serves.

BEiT passes each layer the image resolution as a ``torch.Size``: the recorded graph held
``(32, 32)`` while live calls were keyed ``Size(...)``, so every call ran the original forward
while the tuning table reported 1.80x for those layers.
"""

from __future__ import annotations

import enum
import re

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import Delayed
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.binding import call_signature
from tunetree.signature.graph import GraphKey
from tunetree.signature.modules import module_paths

QUICK = tt.MeasureConfig.quick()


class Mode(enum.Enum):
    SUM = "sum"
    MAX = "max"


class Child(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, extra: object = None) -> torch.Tensor:
        if isinstance(extra, Mode) and extra is Mode.MAX:
            return self.lin(x).relu()
        return self.lin(x)


class Parent(nn.Module):
    """Calls its child with ``make(x)`` as a second argument (a shape, an enum, an object)."""

    def __init__(self, make: object) -> None:
        super().__init__()
        self.child = Child()
        self.make = make

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.child(x, self.make(x)) + 1  # type: ignore[operator]


class Options:
    """A plain object made anew on every call: keyed by its identity."""


def _fallbacks(model: nn.Module) -> int:
    return sum(d.fallback_calls for _, m in module_paths(model) if (d := dispatcher_of(m)))


def _tune_child(make: object) -> tt.TuneResult:
    torch.manual_seed(0)
    model = Parent(make).eval()
    data = [torch.randn(2, 4), torch.randn(3, 4)]
    return tt.tune(
        model,
        data,
        depth=1,
        strategy=tt.OneBackendStrategy(Delayed()),
        measure_config=QUICK,
        verbose=False,
        cache=False,
    )


def test_a_torch_size_keys_as_the_tuple_of_ints_it_is() -> None:
    size = torch.Size([32, 32])
    assert GraphKey.of((size,), {}) == GraphKey.of(((32, 32),), {})
    assert call_signature((size,), {}) == call_signature(((32, 32),), {})
    assert str(GraphKey.of((size,), {})) == "((32, 32))"


def test_enums_dtypes_and_devices_are_constants_not_identities() -> None:
    key = GraphKey.of((Mode.SUM, torch.float16, torch.device("cpu")), {})
    assert not key.has_opaque
    assert key.args[0] == ("const", "enum", f"{__name__}.Mode.SUM")
    assert GraphKey.of((Mode.SUM,), {}) != GraphKey.of((Mode.MAX,), {})
    assert GraphKey.from_json(key.to_json()) == key
    assert call_signature((Mode.SUM,), {}) is not None


@pytest.mark.parametrize(
    "make",
    [lambda x: x.shape[1:], lambda x: Mode.MAX],
    ids=["torch.Size", "enum"],
)
def test_a_child_called_with_a_size_or_an_enum_is_served_by_its_runner(make: object) -> None:
    result = _tune_child(make)
    graph = next(g for g in result.graphs if g.path == "child")
    assert graph.winner is not None and not graph.never_served
    before = _fallbacks(result.model)
    with torch.no_grad():
        result.model(torch.randn(2, 4))
    assert _fallbacks(result.model) == before == 0
    result.undo()


def test_a_graph_its_dispatcher_never_serves_reports_no_speed_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    result = _tune_child(lambda x: Options())  # a new object, a new identity, every call
    graphs = [g for g in result.graphs if g.path == "child"]
    assert len(graphs) == 2 and all(g.winner is not None and g.never_served for g in graphs)
    line = next(line for line in result.table().splitlines() if line.startswith("child"))
    assert "never served" in line and not re.search(r"\d\.\d\dx", line)
    assert "never served a call" in caplog.text
    result.undo()
    # auto_tune marks them too, from its end-to-end check.
    torch.manual_seed(0)
    auto = tt.auto_tune(
        Parent(lambda x: Options()).eval(),
        [torch.randn(2, 4), torch.randn(3, 4)],
        strategy=tt.OneBackendStrategy(Delayed()),
        min_depth=1,
        max_depth=1,
        measure_config=QUICK,
        verbose=False,
        cache=False,
    )
    marked = [g for g in auto.graphs[1] if g.never_served]
    assert {g.path for g in marked} == {"child"} and len(marked) == 2  # one per object
