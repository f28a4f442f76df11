"""A time budget's deadline, read from one clock that tests can replace.

``auto_tune(time_budget=...)`` checks it before every depth, every graph and every candidate
build, so the budget holds within one build (see :func:`tunetree.auto_tune`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

TIME_BUDGET_ERROR = "time budget used up"


def now() -> float:
    """The clock every deadline reads (a module function, so a test can substitute it)."""
    return time.perf_counter()


@dataclass(frozen=True)
class Deadline:
    """The moment a time budget runs out, on :func:`now`'s clock."""

    at: float
    builds: dict[str, float] = field(default_factory=dict, compare=False, repr=False)
    """The longest build seen so far per backend kind (see :meth:`room_for`)."""

    @classmethod
    def after(cls, seconds: float, start: float | None = None) -> Deadline:
        """The deadline ``seconds`` after ``start`` (default: now)."""
        return cls((now() if start is None else start) + seconds)

    def passed(self) -> bool:
        """True once the deadline has passed."""
        return now() > self.at

    def left_s(self) -> float:
        """Seconds left until the deadline (0 once passed)."""
        return max(0.0, self.at - now())

    @contextlib.contextmanager
    def build(self, kind: str) -> Iterator[None]:
        """Time the block as one build of backend ``kind`` (see :meth:`room_for`)."""
        start = now()
        try:
            yield
        finally:
            self.builds[kind] = max(now() - start, self.builds.get(kind, 0.0))

    def room_for(self, kind: str) -> bool:
        """Whether a build of ``kind`` is expected to end before the deadline.

        Expected: as long as the longest build of that kind so far (a first build always has
        room while the deadline has not passed), so a budget is overrun by at most one build
        of each backend instead of one build of whichever comes next.
        """
        return not self.passed() and self.builds.get(kind, 0.0) <= self.left_s()
