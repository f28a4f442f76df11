from __future__ import annotations

import pytest
import torch

import tunetree as tt
from tests.clock import VirtualClock
from tests.fakes import Delayed, Failing, mlp
from tunetree.candidates.evaluate import Status

pytestmark = pytest.mark.usefixtures("virtual_time")
"""Every test here decides on timings its fakes declare (``tests/clock.py``, issue 33)."""

QUICK = tt.MeasureConfig.quick()


def run(strategy, model=None, data=None):
    model = model or mlp()
    result = tt.tune(
        model, data or [torch.randn(4, 16)], strategy=strategy, measure_config=QUICK, verbose=False
    )
    return result.graphs[0]


def test_first_wins_builds_nothing_after_the_first_usable() -> None:
    later = Delayed(0.0, "later")
    graph = run(tt.FirstWinsStrategy([Failing(), Delayed(0.002, "first"), later]))
    assert [r.status for r in graph.rows] == [Status.FAILED, Status.OK, Status.SKIPPED]
    assert graph.winner is graph.rows[1]
    assert later.builds == []


def test_one_backend_strategy() -> None:
    graph = run(tt.OneBackendStrategy(Failing("run")))
    assert graph.winner is None and graph.rows[0].status is Status.FAILED


def test_min_latency_picks_the_fastest(virtual_time: VirtualClock) -> None:
    graph = run(
        tt.MinLatencyStrategy([Delayed(0.003, "a"), Delayed(0.0005, "b"), Delayed(0.002, "c")])
    )
    assert graph.winner.backend.label == "b"


def test_latency_budget_prefers_the_first_within_budget(virtual_time: VirtualClock) -> None:
    backends = [Delayed(0.012, "slow"), Delayed(0.004, "ok"), Delayed(0.0, "fastest")]
    graph = run(tt.LatencyTargetStrategy(8.0, backends))
    assert graph.winner.backend.label == "ok"
    graph = run(tt.LatencyTargetStrategy(0.00001, backends))
    assert graph.winner.backend.label == "fastest"
    with pytest.raises(tt.InvalidInputError):
        tt.LatencyTargetStrategy(0, backends)


def test_highest_throughput_searches_batch_size(virtual_time: VirtualClock) -> None:
    # A fixed per-call overhead makes larger batches worth it until the overhead is amortised.
    strategy = tt.HighestThroughputStrategy(
        [Delayed(0.002, "overhead")], search_max_batch_size=True, max_batch_size=16
    )
    graph = run(strategy, data=[torch.randn(2, 16)])
    assert graph.winner.max_batch_size == 16
    plain = run(tt.HighestThroughputStrategy([Delayed(0.002)]))
    assert plain.winner.max_batch_size is None


def test_strategy_lists_backends_and_refuses_non_backends() -> None:
    text = str(
        tt.HighestThroughputStrategy(
            [tt.backends.Inductor(mode="max-autotune"), tt.backends.Eager()]
        )
    )
    assert "inductor(mode='max-autotune')" in text and "eager" in text
    with pytest.raises(tt.InvalidInputError, match="not a backend"):
        tt.MinLatencyStrategy(["inductor"])  # type: ignore[list-item]


def test_default_strategy_keeps_results_and_runs_here() -> None:
    strategy = tt.default_strategy("cpu")
    assert isinstance(strategy, tt.HighestThroughputStrategy)
    assert not strategy.search_max_batch_size
    kinds = [b.kind for b in strategy.backends]
    assert "inductor" in kinds and kinds[-1] == "eager"
    assert all(b.preserves_results for b in strategy.backends)
    assert all(b.unavailable_reason(torch.device("cpu")) is None for b in strategy.backends)
    assert "eager" in str(strategy)


def test_default_strategy_names_the_extra_of_a_missing_package(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import importlib.util
    import logging

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a)
    )
    with caplog.at_level(logging.WARNING, logger="tunetree.candidates.strategy"):
        strategy = tt.default_strategy("cpu")
    assert "openvino" not in [b.kind for b in strategy.backends]
    assert any("pip install 'tunetree[openvino]'" in r.getMessage() for r in caplog.records)
