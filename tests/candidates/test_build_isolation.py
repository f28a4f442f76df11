"""A candidate's build, failed or not, never changes the samples or cache state the next candidates
see; an integer output that differs is reported by its integer difference, not as inf."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import _FnRunner
from tunetree.backends.base import Backend, Runner
from tunetree.signature.binding import original_forward
from tunetree.signature.compare import compare
from tunetree.signature.graph import Graph

transformers = pytest.importorskip("transformers")

CACHED = 3


class Step(nn.Module):
    """A decode step: appends its keys to the cache it is given and returns it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, past_key_values: Any) -> Any:
        k = self.lin(x)[:, None]
        keys, _ = past_key_values.update(k, k, 0)
        return keys.sum(-2), past_key_values


def cache() -> Any:
    made = transformers.DynamicCache()
    made.update(torch.randn(1, 1, CACHED, 4), torch.randn(1, 1, CACHED, 4), 0)
    return made


def cache_lengths(graph: Graph) -> list[int]:
    return [int(s.args[1].get_seq_length()) for s in graph.samples]


@dataclasses.dataclass(frozen=True)
class MutatesThenFails(Backend):
    """Runs the module on the samples it is handed (as an exporter tracing does), then fails."""

    kind: ClassVar[str] = "fake-mutates-then-fails"

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        for sample in graph.samples:
            module(*sample.args, **sample.kwargs)  # appends to the sample's own cache
        raise RuntimeError("cannot convert: SequenceMark")


@dataclasses.dataclass(frozen=True)
class Observes(Backend):
    """Records the cache lengths of the samples it is handed; runs the original forward."""

    kind: ClassVar[str] = "fake-observes"
    seen: list = dataclasses.field(default_factory=list, compare=False, repr=False)

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        self.seen.append(cache_lengths(graph))
        return _FnRunner(self, original_forward(module))


def test_a_failed_build_that_mutated_its_samples_changes_nothing_for_the_next_candidates() -> None:
    torch.manual_seed(0)
    model = Step().eval()
    data = [{"x": torch.randn(1, 2, 4), "past_key_values": cache()} for _ in range(2)]
    observer = Observes()
    strategy = tt.HighestThroughputStrategy([MutatesThenFails(), observer, tt.backends.Eager()])
    result = tt.tune(
        model,
        data,
        depth=0,
        strategy=strategy,
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    (graph_result,) = result.graphs
    rows = {row.backend.kind: row for row in graph_result.rows}
    assert rows["fake-mutates-then-fails"].status is tt.Status.FAILED
    assert "SequenceMark" in rows["fake-mutates-then-fails"].reason
    assert observer.seen == [[CACHED, CACHED]]  # the original state, not the failed build's
    assert rows["fake-observes"].status is tt.Status.OK, rows["fake-observes"].reason
    assert rows["eager"].status is tt.Status.OK, rows["eager"].reason
    assert cache_lengths(graph_result.graph) == [CACHED, CACHED]
    assert all(d["past_key_values"].get_seq_length() == CACHED for d in data)


def test_an_integer_difference_is_reported_as_an_integer() -> None:
    reference = {"counter": torch.tensor([7, 9], dtype=torch.int64)}
    candidate = {"counter": torch.tensor([7, 12], dtype=torch.int64)}
    verdict = compare(reference, candidate)
    assert not verdict.ok
    assert verdict.max_abs_diff == 3
    assert "counter differs from eager: max abs diff 3 at [1]" in verdict.reason
    assert "inf" not in verdict.reason
    flags = compare(torch.tensor([True, False]), torch.tensor([True, True]))
    assert not flags.ok and flags.max_abs_diff == 1
    assert compare(torch.tensor([2**62]), torch.tensor([-(2**62)])).max_abs_diff == 2**63
