"""GraphSession: close races between candidates are measured again."""

from __future__ import annotations

import dataclasses
import gc
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from tests.fakes import Delayed, Failing, _FnRunner
from tunetree.backends.base import Backend, Runner
from tunetree.candidates import measuring
from tunetree.candidates.evaluate import CandidateRow, GraphSession, Status, close_race
from tunetree.candidates.measure import MeasureConfig, Timing
from tunetree.signature.binding import original_forward
from tunetree.signature.graph import Graph, Sample

pytestmark = pytest.mark.usefixtures("virtual_time")
"""Every test here decides on timings its fakes declare (``tests/clock.py``, issue 33)."""


def row(median: float, spread: float, batch: int = 1, status: Status = Status.OK) -> CandidateRow:
    timing = Timing(median, median - spread, median + spread, median - spread, 5, 1)
    return CandidateRow(Delayed(), status, timing=timing, batch=batch, runner=object())  # type: ignore[arg-type]


def test_close_race_keeps_rows_whose_spread_overlaps_the_fastest() -> None:
    fast, near, far = row(1.0, 0.1), row(1.15, 0.06), row(1.5, 0.1)
    assert close_race([far, near, fast]) == [near, fast]
    assert close_race([fast, far]) == []  # clear winner: fast alone is no race
    assert close_race([fast]) == []
    # per sample: twice the time at twice the batch is the same speed
    assert close_race([fast, row(2.0, 0.1, batch=2)]) != []
    assert close_race([fast, row(1.0, 0.1, status=Status.REJECTED)]) == []


def session(config: MeasureConfig) -> GraphSession:
    module = nn.Linear(4, 4).eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        graph = Graph(Sample((x,)).key, [Sample((x,))], [module(x)])
    return GraphSession(module, "", graph, torch.device("cpu"), measure_config=config)


@pytest.mark.parametrize("rematch", [True, False])
def test_a_close_race_is_measured_again_with_more_trials(
    rematch: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[list[str], int]] = []
    medians = {"0": 1e-3, "1": 1.05e-3, "2": 2e-2}  # two in a race, one far slower

    def fake(calls: Any, device: Any, config: MeasureConfig, deadline: Any = None) -> Any:
        seen.append((sorted(calls), config.trials))
        for fn in calls.values():
            fn()
        return {n: Timing(medians[n], medians[n] * 0.9, medians[n] * 1.1, 0.0, 3, 1) for n in calls}

    monkeypatch.setattr(measuring, "measure", fake)
    config = MeasureConfig(warmup_s=0.0, block_s=0.002, trials=3, min_trials=3, rematch=rematch)
    s = session(config)
    rows = [s.evaluate(b) for b in (Delayed(), Delayed(label="twin"), Delayed(label="slow"))]
    s.measure(rows)
    assert seen[0] == (["0", "1", "2"], 3)
    if rematch:
        assert seen[1:] == [(["0", "1"], 6)]
    else:
        assert seen[1:] == []
    assert all(r.timing is not None for r in rows)


def outputs_alive() -> int:
    """Tensors shaped like :func:`three_samples`' outputs (eager's references among them)."""
    return sum(
        1 for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.shape == OUTPUT_SHAPE
    )


OUTPUT_SHAPE = (3, 11)


@dataclasses.dataclass(frozen=True)
class Tracked(Backend):
    """Eager's forward, off by ``offset``; counts the outputs alive when it is called."""

    kind: ClassVar[str] = "test-tracked"
    offset: float = 0.0
    alive: list[int] = dataclasses.field(default_factory=list, compare=False, repr=False)

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        forward = original_forward(module)

        def run(*args: Any, **kwargs: Any) -> Any:
            self.alive.append(outputs_alive())
            return forward(*args, **kwargs) + self.offset

        return _FnRunner(self, run)


def three_samples() -> GraphSession:
    module = nn.Linear(4, OUTPUT_SHAPE[1]).eval()
    samples = [Sample((torch.randn(OUTPUT_SHAPE[0], 4),)) for _ in range(3)]
    with torch.no_grad():
        graph = Graph(samples[0].key, samples, [module(*s.args) for s in samples])
    return GraphSession(module, "", graph, torch.device("cpu"), measure_config=MeasureConfig())


def test_a_candidates_outputs_are_judged_one_at_a_time() -> None:
    # A decode step's output holds the whole cache: keeping every sample's until all had run
    # made them a large part of tuning's peak device memory.
    backend, session = Tracked(), three_samples()
    before = outputs_alive()  # eager's three references, and any other test's left alive
    row = session.evaluate(backend)
    assert row.status is Status.OK, row.reason
    # At each recorded sample's run no earlier output is alive (probes run after them).
    assert backend.alive[:3] == [before] * 3


def test_the_first_mismatching_sample_rejects_a_candidate_and_is_named() -> None:
    backend = Tracked(offset=1.0)
    row = three_samples().evaluate(backend)
    assert row.status is Status.REJECTED
    assert row.reason.startswith("sample 0: ")
    assert len(backend.alive) == 1  # the other samples were not run
    assert row.max_abs_diff == pytest.approx(1.0)


def test_a_runner_failing_on_a_sample_is_a_run_failure() -> None:
    row = three_samples().evaluate(Failing(stage="run"))
    assert row.status is Status.FAILED and row.reason.startswith("run: ")
