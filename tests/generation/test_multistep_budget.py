"""The multi-step decode trial keeps to auto_tune's time budget.

Decisions only, on a fake clock: eager's check calls and each config's check calls advance it
by set times (a compiled config's first call at batch 1, and its first above batch 1, by a
long compile: its loops share one compiled step), so what is
asserted is which configs are started, stopped and measured, never how fast anything is.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tunetree.candidates import budget
from tunetree.candidates.budget import TIME_BUDGET_ERROR, Deadline
from tunetree.candidates.measure import Timing
from tunetree.generation import multistep_trial
from tunetree.generation.multistep_budget import COMPILE_S, LoopBudget, compiles_for
from tunetree.generation.multistep_generate import MultiStepConfig
from tunetree.generation.multistep_trial import CONFIGS, try_multistep
from tunetree.generation.near_tie import TokenVerdict
from tunetree.signature.graph import Sample

from .test_multistep import prompt, qwen3

EAGER_CALL_S = 1.0
"""Each of eager's check calls (the references)."""
LOOP_CALL_S = 0.5
"""Each check call through a built loop."""
CAPTURE_S = 2.0
"""A new loop of eager's kernels."""


class Clock:
    """``budget.now`` for the test: advanced by the fake calls."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(budget, "now", fake)
    return fake


def _fake_calls(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, compile_s: float, call_s: float = LOOP_CALL_S
) -> list[str]:
    """Check calls that cost time on ``clock`` and return the prompt; the configs called."""
    called: list[str] = []

    def seeded(model: Any, sample: Sample, call: Any) -> torch.Tensor:
        ids = sample.kwargs["input_ids"]
        served = model.__dict__.get("generate")
        if served is None:  # the untuned model: eager's reference
            clock.t += EAGER_CALL_S
            return ids
        called.append(served.config.label)
        key = (int(ids.shape[0]), 256)
        if key not in served.loops:
            served.loops[key] = object()
            clock.t += CAPTURE_S
            compiled = served.__dict__.setdefault("compiled_batches", set())
            if served.config.compiled and min(key[0], 2) not in compiled:
                compiled.add(min(key[0], 2))
                clock.t += compile_s
        clock.t += call_s
        return ids

    monkeypatch.setattr(multistep_trial, "unavailable_reason", lambda model, device: None)
    monkeypatch.setattr(multistep_trial, "_seeded", seeded)
    monkeypatch.setattr(
        multistep_trial, "_judge", lambda model, sample, got, want: TokenVerdict(True)
    )
    return called


def _measure(seen: list[list[str]]) -> Any:
    def measure(models: dict[str, Any]) -> dict[str, Timing]:
        seen.append(sorted(models))
        return {name: Timing(1.0 if name == "untuned" else 0.1, 0, 0, 0, 3, 1) for name in models}

    return measure


def _samples() -> list[Sample]:
    return [Sample((), prompt(1, 5, 1)), Sample((), prompt(2, 7, 2))]


EAGER_LABELS = [c.label for c in CONFIGS if not c.compiled]
COMPILED_LABELS = [c.label for c in CONFIGS if c.compiled]


def test_a_compiled_config_expected_to_outlast_the_budget_is_not_started(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    called = _fake_calls(monkeypatch, clock, compile_s=80.0)
    measured: list[list[str]] = []
    deadline = Deadline(clock.t + 150.0)
    trials = try_multistep(qwen3(), _samples(), None, _measure(measured), deadline=deadline)
    by_label = {t.config.label: t for t in trials}
    assert set(called) == set(EAGER_LABELS)  # the compiled configs' builds never began
    for label in COMPILED_LABELS:
        assert by_label[label].status == "skipped"
        assert TIME_BUDGET_ERROR in by_label[label].reason
        assert "expected to take" in by_label[label].reason
    assert measured == [sorted(["untuned", *EAGER_LABELS])]
    assert any(by_label[label].chosen for label in EAGER_LABELS)
    assert clock.t <= deadline.at


def test_without_a_budget_every_config_is_built(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    called = _fake_calls(monkeypatch, clock, compile_s=80.0)
    trials = try_multistep(qwen3(), _samples(), None, _measure([]))
    assert set(called) == {c.label for c in CONFIGS}
    assert [t.status for t in trials].count("skipped") == 0


def test_time_spent_in_check_calls_decides_whether_the_next_config_starts(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    # Eager's kernels need no compile, but their check calls are slow: the first config's
    # whole build and check (captures and calls) is what the second one is expected to take.
    called = _fake_calls(monkeypatch, clock, compile_s=80.0, call_s=10.0)
    deadline = Deadline(clock.t + 90.0)
    trials = try_multistep(qwen3(), _samples(), None, _measure([]), deadline=deadline)
    first, second = (t for t in trials if not t.config.compiled)
    assert first.status in ("measured", "chosen")  # 4 eager calls, then 3 loops' captures
    assert second.status == "skipped" and "expected to take 46 s" in second.reason
    assert called.count(second.config.label) == 0
    assert clock.t <= deadline.at


def test_a_config_longer_than_expected_stops_between_check_calls_and_none_is_measured(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    # Each compile takes twice the prior: the first compiled config is started (expected to
    # fit), the deadline passes during its third loop's build, and it stops before the next
    # call; nothing after it starts, and nothing is measured past the deadline.
    called = _fake_calls(monkeypatch, clock, compile_s=2 * COMPILE_S)
    measured: list[list[str]] = []
    deadline = Deadline(clock.t + 20.0 + 3 * COMPILE_S + 60.0)
    trials = try_multistep(qwen3(), _samples(), None, _measure(measured), deadline=deadline)
    compiled, attention = (t for t in trials if t.config.compiled)
    assert compiled.status == "skipped" and "stopped after" in compiled.reason
    assert 0 < called.count(compiled.config.label) < 4  # 4 check calls: 2 samples, 2 probes
    assert attention.status == "skipped" and called.count(attention.config.label) == 0
    assert measured == []
    for trial in trials:
        assert not trial.chosen and trial.model is None
        if not trial.config.compiled:
            assert trial.reason == f"{TIME_BUDGET_ERROR} before it was measured"
    # The overrun is at most the one check call in flight: one loop's compile and its call.
    assert clock.t - deadline.at <= 2 * COMPILE_S + LOOP_CALL_S


def test_the_budget_expects_one_compile_per_config_not_one_per_loop() -> None:
    # The loops of batches 1, 8 and 9 (s18's check calls) need two compiles: batch 1's own
    # and one shared by every larger batch.
    assert compiles_for([1, 8, 9]) == 2
    assert compiles_for([8, 9]) == compiles_for([1]) == 1
    limits = LoopBudget(None, loops=3, compiles=2, eager_s=10.0, call_s=2.0)
    assert limits.expected_s(False) == pytest.approx(10.0 + 3 * 3.0)
    assert limits.expected_s(True) == pytest.approx(10.0 + 3 * 3.0 + 2 * COMPILE_S)
    limits.note(False, 6.0, loops=4)
    assert limits.expected_s(True) == pytest.approx(6.0 + 2 * COMPILE_S)
    limits.note(True, 50.0, loops=4)
    assert limits.expected_s(True) == 50.0
    assert limits.skip_reason(True) == ""  # no deadline: every config may start


def test_s18s_default_budget_starts_the_compiled_config(clock: Clock) -> None:
    # s18 at the default budget: 233 s left after the eager-kernel configs (8.8 s each),
    # 39 s kept to measure, loops of batches 1, 8 and 9. One compile per loop (279 s) did not
    # fit; two shared compiles do.
    limits = LoopBudget(Deadline(clock.t + 233.0), loops=3, compiles=compiles_for([1, 8, 9]))
    limits.call_s = 39.0 / 8
    limits.note(False, 8.8, loops=3)
    assert limits.expected_s(True) == pytest.approx(8.8 + 2 * COMPILE_S)
    assert limits.skip_reason(True) == ""


def test_a_compiled_config_whose_shared_compiles_fit_is_started_and_measured(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    # Check calls of batches 1, 2, 3 and 1: three loops but two compiles. 230 s are left
    # after the eager-kernel configs: two compiles (188 s expected) and the measurement fit,
    # one compile per loop (278 s) would not.
    called = _fake_calls(monkeypatch, clock, compile_s=80.0)
    measured: list[list[str]] = []
    deadline = Deadline(clock.t + 250.0)
    trials = try_multistep(qwen3(), _samples(), None, _measure(measured), deadline=deadline)
    compiled, attention = (t for t in trials if t.config.compiled)
    assert called.count(compiled.config.label) == 4
    assert compiled.status in ("measured", "chosen"), compiled.reason
    assert attention.status == "skipped" and "expected to take" in attention.reason
    assert measured == [sorted(["untuned", *EAGER_LABELS, compiled.config.label])]
    assert clock.t <= deadline.at


def test_the_configs_compile_last() -> None:
    # The expected time of a compiled config rests on an eager-kernel config built before it.
    compiled = [c.compiled for c in CONFIGS]
    assert compiled == sorted(compiled)
    assert MultiStepConfig(16, True).compiled
