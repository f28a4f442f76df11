"""A clock for tests that decide on timings: measured durations are what the fakes declare.

The :func:`virtual_time` fixture (``tests/conftest.py``) installs a :class:`VirtualClock` as
``time.perf_counter``, the clock every measurement, deadline and stopwatch of tunetree reads.
:func:`tests.fakes.spin` then advances it instead of busy-waiting, so a candidate that "takes"
10 ms is measured at 10 ms on an idle laptop and on a 2-core machine with two busy loops beside
it alike. A test under it asserts what tunetree decides from known timings, never how fast
the machine is (issue 33). Work that does not spin costs one tick per clock read.

``noise`` adds a seeded disturbance to each spin (a slower call, now and then a long stall, as a
busy neighbour causes), so the robustness of a decision against noise is tested
deterministically too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Disturbance:
    """Seeded noise added to each virtual spin: a relative jitter and rare long stalls."""

    jitter: float = 0.0
    """Each spin lasts up to this fraction longer (uniform)."""
    stall_chance: float = 0.0
    stall_s: float = 0.0
    seed: int = 0
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def __call__(self, seconds: float) -> float:
        extra = seconds * self.jitter * self.rng.random()
        if self.stall_chance and self.rng.random() < self.stall_chance:
            extra += self.stall_s
        return extra


@dataclass
class VirtualClock:
    """A ``perf_counter`` that moves by :attr:`TICK` a read and by whatever fakes spin."""

    now: float = 1000.0
    noise: Disturbance | None = None
    spun_s: float = 0.0
    """Seconds of spins so far (without noise)."""

    TICK = 1e-5
    """Seconds a read advances the clock: bounds the calls a block of work that never spins
    needs to fill its time (a block of 5 ms holds at most 500 calls)."""

    def __call__(self) -> float:
        self.now += self.TICK
        return self.now

    def advance(self, seconds: float) -> None:
        """A fake's busy-wait of ``seconds`` (plus the disturbance, if any)."""
        self.spun_s += seconds
        self.now += seconds + (self.noise(seconds) if self.noise else 0.0)
