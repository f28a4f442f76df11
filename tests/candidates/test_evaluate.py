"""GraphSession: close races between candidates are measured again."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.fakes import Delayed
from tunetree.candidates import evaluate
from tunetree.candidates.evaluate import CandidateRow, GraphSession, Status, close_race
from tunetree.candidates.measure import MeasureConfig, Timing
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

    monkeypatch.setattr(evaluate, "measure", fake)
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
