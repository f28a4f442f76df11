"""Timing that alternates approaches call by call, as a serving process does (issue 30).

``candidates.measure`` times blocks of back-to-back calls, each block after an untimed
call: what a runtime costs once it has the machine to itself. In a serving process a call
follows other work (another runtime, the user's code), and pays for what that left behind
(a cold cache, threads still spinning or asleep). :func:`interleaved_passes` times that: the
approaches alternate one pass over the calls at a time, every call timed, no untimed call
before a pass.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from tunetree.signature.graph import Sample
from tunetree.signature.modules import synchronize


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds one call takes, synchronised on the device."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


@dataclasses.dataclass
class Stat:
    """Median and quartiles of one value per round (seconds, or a ratio)."""

    median_s: float
    q1_s: float
    q3_s: float
    values: list[float] = dataclasses.field(default_factory=list, repr=False)

    @classmethod
    def of(cls, values: list[float]) -> Stat:
        if len(values) < 2:
            return cls(values[0], values[0], values[0], list(values))
        q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return cls(median, q1, q3, list(values))

    def text(self) -> str:
        spread = 50 * (self.q3_s - self.q1_s) / self.median_s if self.median_s else 0.0
        return f"{1e3 * self.median_s:.3f} ±{spread:.1f}%"

    def ratio_text(self) -> str:
        """A ratio with its interquartile range: ``1.021 (1.004-1.035)``."""
        return f"{self.median_s:.3f} ({self.q1_s:.3f}-{self.q3_s:.3f})"


def paired(a: Stat, b: Stat) -> Stat:
    """The ratio ``a / b`` round by round (both measured in the same rounds), as a Stat.

    Each round's two values were taken seconds apart, so a load change between rounds (a
    neighbour process on a shared machine) moves both and cancels in their ratio: the median
    of the ratios is steadier than the ratio of the medians.
    """
    return Stat.of([x / y for x, y in zip(a.values, b.values, strict=True)])


def rotations(names: list[str], rounds: int) -> list[list[str]]:
    """Per round, the names in an order where each follows every other one equally often.

    The rows of a Williams design, cycled: over its ``n`` rows (``2n`` for an odd ``n``) each
    name comes first once and right after each other name once. Rotating one order kept every
    name behind the same one, and what that one leaves (torch's OpenMP threads spinning after
    eager work, a runtime's worker threads) was charged to the same approach every round:
    auto_tune's ONNX Runtime plan, always right after eager, read 1.18x the same plan tuned
    alone on an MLP.
    """
    n = len(names)
    if n < 2:
        return [list(names) for _ in range(rounds)]
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(i + shift) % n for i in first] for shift in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [[names[i] for i in rows[r % len(rows)]] for r in range(rounds)]


def interleaved_passes(
    approaches: dict[str, Callable[[Sample], Any]],
    samples: list[Sample],
    device: torch.device,
    rounds: int,
) -> dict[str, Stat]:
    """Per round, each approach runs one pass over ``samples``, every call timed; mean per call.

    No untimed call before a pass: each pass starts right after another approach's, as a
    call in a process that does other things does. One untimed pass each first (first-call
    work: a capture, a compile).
    """
    with torch.no_grad():
        for fn in approaches.values():
            for s in samples:
                fn(s)
        per_call: dict[str, list[float]] = {name: [] for name in approaches}
        for order in rotations(list(approaches), rounds):
            for name in order:
                fn = approaches[name]
                total = sum(timed(lambda s=s, fn=fn: fn(s), device) for s in samples)
                per_call[name].append(total / len(samples))
    return {name: Stat.of(v) for name, v in per_call.items()}
