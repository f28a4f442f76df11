"""Candidates for ranged graphs are checked on probe shapes and value probes (issue 12)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from tests.fakes import _FnRunner, quick_tune
from tunetree.backends.base import Backend, Runner
from tunetree.backends.eager import Eager
from tunetree.candidates.evaluate import Status
from tunetree.signature.binding import original_forward
from tunetree.signature.graph import Graph, GraphKey, Sample, flatten
from tunetree.signature.probes import checks


@dataclasses.dataclass(frozen=True)
class RecordedOnly(Backend):
    """Right on the exact shapes it was built with, off by one on every other shape."""

    kind: ClassVar[str] = "test-recorded-only"

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        seen = {s.key for s in graph.samples}
        forward = original_forward(module)

        def run(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            return out if GraphKey.of(args, kwargs) in seen else out + 1

        return _FnRunner(self, run)


@dataclasses.dataclass(frozen=True)
class BakedBranch(Backend):
    """Bakes the branch the first recorded sample took, as a tracing exporter would."""

    kind: ClassVar[str] = "test-baked-branch"

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        positive = bool(graph.samples[0].args[0].sum() > 0)
        return _FnRunner(self, lambda x: x * 2 if positive else x - 1)


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x - 1


def batches(*sizes: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(b, 8) for b in sizes]


def test_probe_shape_failure_rejects_candidate_for_the_range() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).eval()
    result = quick_tune(model, batches(2, 4, 9), [RecordedOnly(), Eager()])
    (graph,) = result.graphs
    assert str(graph.graph.key) == "(f32[batch 2..9, 8])"
    rows = {r.backend.kind: r for r in graph.rows}
    bad = rows["test-recorded-only"]
    assert bad.status is Status.REJECTED
    assert bad.reason.startswith("wrong on probe batch=5: ")
    assert graph.winner is rows["eager"]


def test_exact_graphs_do_not_get_shape_probes() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).eval()
    result = quick_tune(model, batches(4, 4), [RecordedOnly(), Eager()])
    assert result.graphs[0].rows[0].status is Status.OK


def test_value_probe_rejects_a_baked_branch() -> None:
    x = torch.full((3, 8), 3.0)
    result = quick_tune(Branchy().eval(), [x], [BakedBranch(), Eager()])
    rows = {r.backend.kind: r for r in result.graphs[0].rows}
    assert rows["test-baked-branch"].status is Status.REJECTED
    assert rows["test-baked-branch"].reason.startswith("wrong on value probe")
    assert rows["eager"].status is Status.OK


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


@dataclasses.dataclass(frozen=True)
class ClampedLog(Backend):
    """Right wherever log is finite, finite where eager's log is nan."""

    kind: ClassVar[str] = "test-clamped-log"

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        return _FnRunner(self, lambda x: torch.log(x.clamp(min=1e-30)))


def test_value_probes_eager_cannot_answer_are_skipped() -> None:
    # negated inputs make log() nan: not valid inputs, so they reject nothing
    result = quick_tune(Log().eval(), [torch.rand(3, 8) + 1], [ClampedLog(), Eager()])
    assert result.graphs[0].rows[0].status is Status.OK


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_probes_of_a_device_graph_wait_in_host_memory_and_are_used_on_the_device() -> None:
    # A decode step's probes and eager's outputs on them each hold a whole cache: kept on the
    # device for every graph, they were a large part of tuning's peak device memory.
    module = nn.Linear(4, 3).cuda().eval()
    samples = [Sample((torch.randn(2, 4, device="cuda"),)) for _ in range(2)]
    with torch.no_grad():
        graph = Graph(samples[0].key, samples, [module(*s.args) for s in samples])
    used = list(checks(module, graph))
    assert used and graph.checks is not None
    kept, _ = flatten([(inputs, expected) for _, inputs, expected in graph.checks])
    assert all(t.device.type == "cpu" for t in kept if isinstance(t, torch.Tensor))
    for probe in used:
        expected = probe.expected()
        assert probe.private and probe.sample.args[0].is_cuda and expected.is_cuda
        with torch.no_grad():
            assert torch.allclose(probe.run(module), expected)


def test_probes_of_a_host_graph_are_used_as_kept() -> None:
    module = nn.Linear(4, 3).eval()
    samples = [Sample((torch.randn(2, 4),)) for _ in range(2)]
    with torch.no_grad():
        graph = Graph(samples[0].key, samples, [module(*s.args) for s in samples])
    used = list(checks(module, graph))
    assert used and graph.checks is not None
    for probe, (_, (inputs, input_homes), (expected, homes)) in zip(
        used, graph.checks, strict=True
    ):
        assert input_homes is None and homes is None  # nothing parked, no copies
        assert not probe.private  # a run copies state it could mutate
        assert probe.sample.args is inputs[0] and probe.expected() is expected
