"""A time budget's deadline, read from one clock that tests can replace.

``auto_tune(time_budget=...)`` checks it before every depth, every graph and every candidate
build, so the budget holds within one build (see :func:`tunetree.auto_tune`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

TIME_BUDGET_ERROR = "time budget used up"


def now() -> float:
    """The clock every deadline reads (a module function, so a test can substitute it)."""
    return time.perf_counter()


@dataclass(frozen=True)
class Deadline:
    """The moment a time budget runs out, on :func:`now`'s clock."""

    at: float

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
