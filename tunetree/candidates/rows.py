"""One candidate's outcome on one graph: its row, its status and the verdict on its outputs."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from .._util.table import format_seconds
from ..backends.base import Backend, Runner
from .measure import Timing


class Status(str, enum.Enum):
    """What happened to a candidate."""

    OK = "ok"
    UNAVAILABLE = "unavailable"
    FAILED = "failed"
    REJECTED = "rejected"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value


@dataclass
class CandidateRow:
    """One backend's outcome on one graph."""

    backend: Backend
    status: Status
    reason: str = ""
    build_s: float | None = None
    max_abs_diff: float | None = None
    timing: Timing | None = None
    batch: int = 1
    max_batch_size: int | None = None
    runner: Runner | None = field(default=None, repr=False, compare=False)
    per_shape: dict[str, Timing] = field(default_factory=dict, repr=False)
    """Latency per recorded shape of a ranged graph (winner and eager; see
    :meth:`GraphSession.measure_shapes`), by the sizes of its dimensions."""
    error: float | None = None
    """Error on the graph's samples in the accuracy budget's module metric (tuned with a
    budget only; see :class:`tunetree.AccuracyBudget`)."""
    screened_out: bool = False
    """Dropped by the screening measurement: it could not be within the margin of the leader
    (its ``timing`` is the screening's; it takes no part in the choice)."""

    @property
    def latency_s(self) -> float | None:
        """Median latency of the candidate, or None when not measured."""
        return self.timing.median_s if self.timing else None

    @property
    def throughput(self) -> float | None:
        """Samples per second at the measured batch size."""
        return self.batch / self.timing.median_s if self.timing else None

    @property
    def usable(self) -> bool:
        """True when the candidate's status is OK and it has a runner."""
        return self.status is Status.OK and self.runner is not None

    def describe(self) -> str:
        """Status and reason in one cell."""
        note = "" if self.backend.preserves_results else " (changes results, opt-in)"
        return f"{self.status}{note}" + (f": {self.reason}" if self.reason else "")

    def latency_text(self) -> str:
        """The measured latency as the table shows it."""
        return str(self.timing) if self.timing else format_seconds(None)


class Verdict(NamedTuple):
    """How a candidate's outputs of a graph's samples compare with eager's."""

    reason: str
    """Why they are not acceptable ("" when they are)."""
    max_abs_diff: float
    """The largest absolute difference from eager's."""
    error: float | None
    """Under an accuracy budget, the largest error in its module metric (else None)."""


class RunError(Exception):
    """A runner raised on a recorded sample (its candidate's row says ``run: ...``)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def short_error(exc: BaseException, limit: int = 300) -> str:
    """``exc`` as one line: its type and message, cut to ``limit`` characters."""
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
