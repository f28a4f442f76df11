"""Honest timing: warm-up, device synchronisation, interleaved repeated trials, medians, spread.

Every strategy and :func:`tunetree.auto_tune` time through :func:`measure`. Candidates
are measured in *blocks* of calls (each block long enough for the host timer, and
preceded by one untimed call, because runtimes disturb each other: a runtime's thread
pool still spinning from the previous candidate slows the next one). Blocks of all
candidates are interleaved round by round in a rotating order, so a slow drift of the
machine (clock ramp-up, a neighbour process) touches every candidate alike. The result
is the median per-call time over blocks, with the interquartile range as spread.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping

import torch

from .._util.table import format_seconds
from ..signature.modules import synchronize
from .budget import Deadline


@dataclasses.dataclass(frozen=True)
class MeasureConfig:
    """How long and how often to measure.

    ``MeasureConfig.quick()``, ``first_look()``, ``screening()`` and ``confirming()`` are the
    presets tuning uses; pass one as ``measure_config=``.

    Args:
        warmup_s: Untimed calls per candidate before timing, in seconds.
        min_warmup_calls: At least this many untimed calls.
        block_s: Target duration of one timed block of calls.
        trials: Timed blocks per candidate (fewer when ``max_s_per_candidate`` would be
            exceeded, never fewer than ``min_trials``).
        min_trials: The fewest blocks a decision rests on.
        max_s_per_candidate: The most time one candidate's trials may take.
        rematch: When candidates' spreads overlap the fastest one's, time those finalists
            again, alone together, with twice the trials (see :meth:`longer`).
        stop_when_clear: Stop the trials once every candidate has ``clear_after`` of them and
            the fastest one's spread lies below every other's.
        clear_after: See ``stop_when_clear``.
        screen: Before measuring three or more candidates in full, a short screening
            measurement (:meth:`screening`) drops those whose fastest quarter of blocks is
            slower than the leader's slowest quarter plus ``screen_margin``.
        screen_margin: See ``screen``.

    Example:
        >>> import tunetree as tt
        >>> tt.MeasureConfig(rematch=False).trials
        11
    """

    warmup_s: float = 0.2
    min_warmup_calls: int = 2
    block_s: float = 0.05
    trials: int = 11
    min_trials: int = 3
    max_s_per_candidate: float = 3.0
    rematch: bool = True
    stop_when_clear: bool = True
    clear_after: int = 5
    screen: bool = True
    screen_margin: float = 0.05

    @classmethod
    def quick(cls) -> MeasureConfig:
        """Short measurements for tests and dry runs (less precise, no rematch)."""
        return cls(
            warmup_s=0.02,
            block_s=0.005,
            trials=5,
            min_trials=3,
            max_s_per_candidate=0.5,
            rematch=False,
        )

    @classmethod
    def first_look(cls) -> MeasureConfig:
        """``auto_tune(quick=True)``: five blocks, at most 1 s per candidate, no rematch."""
        return cls(warmup_s=0.1, trials=5, min_trials=3, max_s_per_candidate=1.0, rematch=False)

    def screening(self) -> MeasureConfig:
        """A short first look: three blocks of a quarter length, a tenth of the time, no rematch.

        Shorter blocks are noisier: their wider spread makes screening keep more, never drop more.
        """
        return dataclasses.replace(
            self,
            warmup_s=min(self.warmup_s, 0.05),
            block_s=self.block_s / 4,
            trials=3,
            min_trials=3,
            max_s_per_candidate=self.max_s_per_candidate / 10,
            rematch=False,
            stop_when_clear=False,
        )

    def confirming(self) -> MeasureConfig:
        """A race whose outcome a twin already decided: at most five blocks, half the time.

        The blocks keep their length (unlike :meth:`screening`), so the spread stays honest;
        no rematch.
        """
        return dataclasses.replace(
            self,
            trials=min(self.trials, 5),
            min_trials=min(self.min_trials, 3),
            max_s_per_candidate=self.max_s_per_candidate / 2,
            rematch=False,
        )

    def least_s(self, candidates: int, call_s: float = 0.0, cycle: int = 1) -> float:
        """About the shortest measurement of ``candidates``: warm-up and ``min_trials`` blocks.

        ``call_s``: one call's duration when known; ``cycle``: the calls of one pass over the
        samples (a block is a whole number of passes).
        """
        warm = max(self.warmup_s, self.min_warmup_calls * call_s)
        block = max(self.block_s + cycle * call_s, cycle * call_s) + call_s  # + the untimed call
        return candidates * (warm + self.min_trials * block)

    def longer(self) -> MeasureConfig:
        """This configuration with twice the trials and time per candidate (for a rematch)."""
        return dataclasses.replace(
            self,
            trials=2 * self.trials,
            min_trials=2 * self.min_trials,
            max_s_per_candidate=2 * self.max_s_per_candidate,
        )


@dataclasses.dataclass(frozen=True)
class Timing:
    """Per-call latency statistics over timed blocks."""

    median_s: float
    q1_s: float
    q3_s: float
    min_s: float
    trials: int
    calls_per_trial: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.q3_s - self.q1_s) / self.median_s if self.median_s > 0 else 0.0

    def __str__(self) -> str:
        return f"{format_seconds(self.median_s)} ±{100 * self.spread / 2:.1f}%"


def _stats(per_call: list[float], calls: int) -> Timing:
    ordered = sorted(per_call)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return Timing(statistics.median(ordered), q1, q3, ordered[0], len(ordered), calls)


def _warm_up(
    fn: Callable[[], object],
    device: torch.device,
    config: MeasureConfig,
    budget: Deadline | None = None,
) -> float:
    """Run ``fn`` untimed; return an estimate of one call's duration.

    One call only once ``budget`` has no time left but its reserve.
    """
    durations: list[float] = []
    deadline = time.perf_counter() + config.warmup_s
    while len(durations) < config.min_warmup_calls or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        synchronize(device)
        durations.append(time.perf_counter() - start)
        if len(durations) >= 1000 or (budget is not None and budget.free_s() <= 0):
            break
    tail = durations[len(durations) // 2 :]
    return max(statistics.median(tail), 1e-7)


def measure(
    candidates: Mapping[str, Callable[[], object]],
    device: torch.device | str = "cpu",
    config: MeasureConfig | None = None,
    deadline: Deadline | None = None,
) -> dict[str, Timing]:
    """Time each zero-argument callable; returns a :class:`Timing` per name.

    Calls run under ``torch.no_grad()`` with device synchronisation around every block. With a
    ``deadline``, each candidate's time cap is at most its share of the time left before the
    deadline's reserve, and the trial rounds stop once that is used up (every candidate keeps
    its ``min_trials`` blocks: a decision on fewer would be noise). The time cap holds on the
    time really spent, not only on the warm-up's estimate. With
    ``config.stop_when_clear`` they stop once the fastest candidate is clearly the fastest.
    """
    config = config or MeasureConfig()
    dev = torch.device(device)
    names = list(candidates)
    if not names:
        return {}
    with torch.no_grad():
        cap_s = config.max_s_per_candidate
        if deadline is not None:
            cap_s = min(cap_s, deadline.free_s() / len(names))
        # The warm-up is at most a quarter of the time a candidate may take.
        warm = dataclasses.replace(config, warmup_s=min(config.warmup_s, cap_s / 4))
        estimates = {name: _warm_up(candidates[name], dev, warm, deadline) for name in names}
        calls = {
            name: _whole_cycles(candidates[name], math.ceil(config.block_s / estimates[name]))
            for name in names
        }
        trials = {
            name: max(
                config.min_trials,
                min(config.trials, int(cap_s / (estimates[name] * (calls[name] + 1)))),
            )
            for name in names
        }
        per_call: dict[str, list[float]] = {name: [] for name in names}
        spent = dict.fromkeys(names, 0.0)

        def done(name: str) -> bool:
            # The cap holds on the time really spent: calls can be slower than warm-up said.
            n = len(per_call[name])
            return n >= trials[name] or (n >= config.min_trials and spent[name] >= cap_s)

        for round_index in range(max(trials.values())):
            if round_index and _stop(per_call, done, config, deadline):
                break
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                if done(name):
                    continue
                fn = candidates[name]
                began = time.perf_counter()
                fn()  # untimed: lets the previous runtime's threads settle into this one
                synchronize(dev)
                start = time.perf_counter()
                for _ in range(calls[name]):
                    fn()
                synchronize(dev)
                end = time.perf_counter()
                per_call[name].append((end - start) / calls[name])
                spent[name] += end - began
    return {name: _stats(per_call[name], calls[name]) for name in names}


def _stop(
    per_call: dict[str, list[float]],
    done: Callable[[str], bool],
    config: MeasureConfig,
    deadline: Deadline | None,
) -> bool:
    """Whether to stop before the next round.

    Every candidate has its ``min_trials`` blocks (a decision needs them) and either all are
    done, the deadline has no time left but its reserve, or the decision is clear.
    """
    if any(len(v) < config.min_trials and not done(n) for n, v in per_call.items()):
        return False
    if all(done(n) for n in per_call):
        return True
    if deadline is not None and deadline.free_s() <= 0:
        return True
    if not config.stop_when_clear or len(per_call) < 2:
        return False
    if any(len(v) < config.clear_after and not done(n) for n, v in per_call.items()):
        return False
    return separated({n: _stats(v, 1) for n, v in per_call.items()})


def separated(timings: Mapping[str, Timing]) -> bool:
    """Whether the fastest timing's spread lies entirely below every other timing's."""
    if len(timings) < 2:
        return False
    best = min(timings, key=lambda n: timings[n].median_s)
    return all(timings[best].q3_s < t.q1_s for n, t in timings.items() if n != best)


class _Cycle:
    """Calls ``fn`` on each sample in turn; ``cycle`` is how many calls make one pass."""

    def __init__(self, fn: Callable[..., object], samples: list) -> None:
        self.fn, self.samples, self.cycle, self.i = fn, samples, len(samples), 0

    def __call__(self) -> object:
        sample = self.samples[self.i % self.cycle]
        self.i += 1
        return sample.run(self.fn)


def cycle_calls(fn: Callable[..., object], samples: list) -> Callable[[], object]:
    """A zero-argument callable that calls ``fn`` on each sample in turn.

    :func:`measure` makes each timed block of such a callable a whole number of passes over
    ``samples``: with a mix of shapes, every block then holds the same mix, so the spread
    between blocks is the machine's noise, not which shapes a block happened to hold.
    """
    return _Cycle(fn, samples)


def _whole_cycles(fn: Callable[[], object], calls: int) -> int:
    """Round ``calls`` up to whole passes of a :func:`cycle_calls` callable.

    Any window of that length over the cyclic sequence holds each sample equally often.
    """
    cycle = getattr(fn, "cycle", 1)
    return max(1, math.ceil(max(1, calls) / cycle)) * cycle
