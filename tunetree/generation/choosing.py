"""What the whole-model trials of ``generate`` share: timing the configs that passed, choosing.

Both the CPU's stateful runner (:mod:`.stateful_trial`) and the GPU's multi-step loop
(:mod:`.multistep_trial`) end the same way: every config that passed its check is timed end
to end beside the untuned model, interleaved, and the fastest that beats it is chosen; the
others let go of their runners, so that their threads or graphs cost nothing afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..candidates.measure import Timing

UNTUNED = "untuned"
Measure = Callable[[dict[str, Any]], dict[str, Timing]]
"""Times models end to end, interleaved: name -> model in, name -> timing out."""


@dataclass
class Trial:
    """A whole-model config tried for ``generate``: built, checked, measured, or why not."""

    config: Any
    status: str = "not tried"
    reason: str = ""
    build_s: float | None = None
    timing: Timing | None = None
    untuned: Timing | None = None
    chosen: bool = False
    model: Any = field(default=None, repr=False)

    @property
    def speedup(self) -> float | None:
        """The untuned model's median over this one's, measured side by side."""
        if self.timing is None or self.untuned is None or not self.timing.median_s:
            return None
        return self.untuned.median_s / self.timing.median_s


def measure_and_choose(trials: Sequence[Trial], model: Any, measure: Measure) -> None:
    """Time the passed configs beside the untuned model; choose the fastest that beats it."""
    passed = [t for t in trials if t.status == "passed"]
    if passed:
        timings = measure({UNTUNED: model, **{t.config.label: t.model for t in passed}})
        for trial in passed:
            trial.timing, trial.untuned = timings.get(trial.config.label), timings.get(UNTUNED)
            trial.status = "measured"
    winners = [t for t in passed if t.speedup is not None and t.speedup > 1.0]
    if winners:
        best = min(winners, key=lambda t: t.timing.median_s if t.timing else float("inf"))
        best.chosen, best.status = True, "chosen"
    for trial in trials:
        if not trial.chosen:
            trial.model = None  # its runner's threads or graphs must not slow what comes next
