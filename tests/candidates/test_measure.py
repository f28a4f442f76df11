from __future__ import annotations

import torch

import tunetree as tt
from tests.fakes import spin
from tunetree.candidates.measure import cycle_calls
from tunetree.signature.graph import Sample


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


def test_blocks_hold_whole_passes_over_a_mix_of_samples() -> None:
    """With samples of very different cost, every timed block must hold the same mix: the
    spread then reflects the machine, not which samples a block happened to hold."""
    seen: list[float] = []

    def run(seconds: float) -> None:
        seen.append(seconds)
        spin(seconds)

    samples = [Sample((s,)) for s in (1e-4, 1e-4, 1e-4, 3e-3)]
    timing = tt.measure(
        {"mix": cycle_calls(run, samples)},
        config=tt.MeasureConfig(warmup_s=0.0, block_s=1e-3, trials=5, min_trials=5),
    )["mix"]
    assert timing.calls_per_trial % len(samples) == 0
    assert timing.spread < 0.5, timing  # a block of 3 cheap calls vs one with the slow call: ~10x
