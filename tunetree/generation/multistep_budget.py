"""What the multi-step decode trial may start under auto_tune's time budget.

A config of the loop builds one captured loop per batch size and cache capacity its check
calls need: a few seconds each for eager's kernels. A compiled config's loops share one
compiled step (:func:`~.multistep.compiled_step`): batch 1 compiles its own code and every
batch above 1 shares one compile with a symbolic batch dimension, each a cold Inductor compile
under coordinate-descent tuning (83-98 s for a 0.6B model in bf16); its other loops only
capture. A capture cannot be interrupted safely (it holds the stream's capture mode and the
allocator's private pool), so the budget decides what is started: a config is started only
when the time it is expected to take, and the measurement after it, fit in what is left;
between its check calls it stops once the deadline has passed, so one check call (one loop's
build and one ``generate``) is the most a started config can overrun by.

Expected times come from what this trial measured: a config's whole build and check (the
eager-kernel configs' and the compiled configs' longest so far), and before any compiled
config was built, the eager-kernel config's time plus :data:`COMPILE_S` per compile the
config's batch sizes need (:func:`compiles_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..candidates import budget
from ..candidates.budget import TIME_BUDGET_ERROR, Deadline
from ..signature.graph import Sample

COMPILE_S = 90.0
"""Seconds one compile of a compiled config's step is expected to take until one compiled
config was built in this trial (a cold compile of a 0.6B model's step took 83-98 s)."""
CAPTURE_S_PER_LOOP = 3.0
"""Seconds one loop of eager's kernels is expected to take to capture (about 1-3 s)."""
MEASURE_CALLS = 8
"""Eager ``generate`` calls kept for the measurement of the configs that passed: the untuned
model's warm-up and timed blocks (each with its untimed call) and the loops', which are faster."""


@dataclass
class LoopBudget:
    """The deadline the trial watches and what its configs took so far."""

    deadline: Deadline | None
    loops: int = 1
    """Captured loops one config builds for the check calls (batch sizes and capacities)."""
    eager_s: float = 0.0
    """One pass of the check calls through eager ``generate`` (the references)."""
    call_s: float = 0.0
    """The longest eager ``generate`` call among them."""
    compiles: int = 1
    """Compiles of the step a compiled config is expected to make (:func:`compiles_for`)."""
    took: dict[bool, float] = field(default_factory=dict)
    """The longest build and check so far, of eager-kernel (False) and compiled (True) configs."""

    @property
    def reserve_s(self) -> float:
        """Seconds kept after the configs for their measurement beside the untuned model."""
        return MEASURE_CALLS * self.call_s

    def expected_s(self, compiled: bool) -> float:
        """How long a config's build and check is expected to take."""
        eager = self.took.get(False, self.eager_s + self.loops * CAPTURE_S_PER_LOOP)
        if not compiled:
            return eager
        return self.took.get(True, eager + self.compiles * COMPILE_S)

    def skip_reason(self, compiled: bool) -> str:
        """Why a config is not started ("" when it is expected to end in time, measured)."""
        if self.deadline is None:
            return ""
        need, left = self.expected_s(compiled), self.deadline.left_s()
        if not self.deadline.passed() and need + self.reserve_s <= left:
            return ""
        return (
            f"{TIME_BUDGET_ERROR} ({left:.0f} s left; expected to take {need:.0f} s "
            f"and {self.reserve_s:.0f} s to measure)"
        )

    def note(self, compiled: bool, seconds: float, loops: int) -> None:
        """Record a config's build and check time, and how many loops it built."""
        self.took[compiled] = max(seconds, self.took.get(compiled, 0.0))
        self.loops = max(self.loops, loops)

    def passed(self) -> bool:
        """Whether the deadline has passed (never without one)."""
        return self.deadline is not None and self.deadline.passed()


def compiles_for(batches: Iterable[int]) -> int:
    """Compiles of the shared step that loops of these batch sizes need.

    Batch 1 has its own code; every larger batch shares one (:func:`~.multistep.compiled_step`).
    """
    return len({min(int(b), 2) for b in batches})


def timed_references(
    calls: Sequence[Sample], run: Callable[[Sample], Any], limits: LoopBudget
) -> list[Any] | None:
    """Eager's output for each check call (``run`` of it), timed into ``limits``.

    Returns None, and stops calling, once the deadline has passed.
    """
    outputs: list[Any] = []
    started = budget.now()
    for sample in calls:
        if limits.passed():
            return None
        before = budget.now()
        outputs.append(run(sample))
        limits.call_s = max(limits.call_s, budget.now() - before)
    limits.eager_s = budget.now() - started
    return outputs
