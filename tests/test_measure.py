from __future__ import annotations

import torch

import tunetree as tt
from tests.fakes import spin


def test_timing_statistics_are_ordered() -> None:
    timings = tt.measure({"a": lambda: spin(0.001)}, config=tt.MeasureConfig.quick())
    t = timings["a"]
    assert t.min_s <= t.q1_s <= t.median_s <= t.q3_s
    assert 0.0009 < t.median_s < 0.005
    assert t.trials >= 3 and t.calls_per_trial >= 1
    assert "ms" in str(t)


def test_same_winner_in_five_runs_when_gap_is_ten_percent() -> None:
    """Part 6 of the core issue: two artificial candidates of known latency, 10% apart."""
    config = tt.MeasureConfig(warmup_s=0.05, block_s=0.02, trials=11, max_s_per_candidate=0.6)
    winners = []
    for _ in range(5):
        timings = tt.measure(
            {"slow": lambda: spin(0.0011), "fast": lambda: spin(0.0010)}, config=config
        )
        winners.append(min(timings, key=lambda n: timings[n].median_s))
    assert winners == ["fast"] * 5


def test_measure_runs_without_grad() -> None:
    seen = []
    tt.measure({"a": lambda: seen.append(torch.is_grad_enabled())}, config=tt.MeasureConfig.quick())
    assert seen and not any(seen)


def test_time_per_candidate_is_bounded() -> None:
    import time

    config = tt.MeasureConfig(
        warmup_s=0.01, block_s=0.01, trials=50, min_trials=3, max_s_per_candidate=0.2
    )
    start = time.perf_counter()
    timing = tt.measure({"a": lambda: spin(0.01)}, config=config)["a"]
    assert time.perf_counter() - start < 1.5
    assert timing.trials < 50
