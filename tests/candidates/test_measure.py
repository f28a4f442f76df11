from __future__ import annotations

import torch

import tunetree as tt
from tests.clock import Disturbance, VirtualClock
from tests.fakes import spin
from tunetree.candidates.measure import cycle_calls, measure
from tunetree.signature.graph import Sample


def test_timing_statistics_are_ordered(virtual_time: VirtualClock) -> None:
    virtual_time.noise = Disturbance(jitter=0.5, seed=1)
    timings = measure({"a": lambda: spin(0.001)}, config=tt.MeasureConfig.quick())
    t = timings["a"]
    assert t.min_s <= t.q1_s <= t.median_s <= t.q3_s
    assert t.min_s >= 0.001 and t.median_s <= 0.0015 + 1e-4  # a spin of 1 ms plus <= 50% jitter
    assert t.trials >= 3 and t.calls_per_trial >= 1
    assert "ms" in str(t)


def test_same_winner_in_five_runs_when_gap_is_ten_percent(virtual_time: VirtualClock) -> None:
    """Part 6 of the core issue: two artificial candidates of known latency, 10% apart.

    On the virtual clock with a disturbance like a busy neighbour's: every call up to 20%
    slower, and one call in 100 stalled by 2 ms (twice a call): the interleaved medians still
    pick the faster one in every seeded run.
    """
    config = tt.MeasureConfig(warmup_s=0.05, block_s=0.02, trials=11, max_s_per_candidate=0.6)
    winners = []
    for seed in range(5):
        virtual_time.noise = Disturbance(jitter=0.2, stall_chance=0.01, stall_s=0.002, seed=seed)
        timings = measure(
            {"slow": lambda: spin(0.0011), "fast": lambda: spin(0.0010)}, config=config
        )
        winners.append(min(timings, key=lambda n: timings[n].median_s))
    assert winners == ["fast"] * 5


def test_measure_runs_without_grad() -> None:
    seen = []
    measure({"a": lambda: seen.append(torch.is_grad_enabled())}, config=tt.MeasureConfig.quick())
    assert seen and not any(seen)


def test_time_per_candidate_is_bounded(virtual_time: VirtualClock) -> None:
    config = tt.MeasureConfig(
        warmup_s=0.01, block_s=0.01, trials=50, min_trials=3, max_s_per_candidate=0.2
    )
    timing = measure({"a": lambda: spin(0.01)}, config=config)["a"]
    assert timing.trials < 50
    # the cap, plus the warm-up (a quarter of it) and the block that crossed it
    assert virtual_time.spun_s <= 0.2 + 0.05 + 2 * 0.01 + 1e-9


def test_blocks_hold_whole_passes_over_a_mix_of_samples(virtual_time: VirtualClock) -> None:
    """With samples of very different cost, every timed block must hold the same mix: the
    spread then reflects the machine, not which samples a block happened to hold."""
    seen: list[float] = []

    def run(seconds: float) -> None:
        seen.append(seconds)
        spin(seconds)

    samples = [Sample((s,)) for s in (1e-4, 1e-4, 1e-4, 3e-3)]
    timing = measure(
        {"mix": cycle_calls(run, samples)},
        config=tt.MeasureConfig(warmup_s=0.0, block_s=1e-3, trials=5, min_trials=5),
    )["mix"]
    assert timing.calls_per_trial % len(samples) == 0
    assert timing.spread < 0.5, timing  # a block of 3 cheap calls vs one with the slow call: ~10x
