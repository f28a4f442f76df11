"""What error a user accepts in exchange for speed: :class:`AccuracyBudget`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import InvalidInputError
from .metrics import Metric, check_metric, metric_name

DEFAULT_MODULE_MAX_ERROR = 5e-2
"""Relative L2 error a module's candidate may have on its own outputs when the budget gives no
limit in that metric (a task-metric budget, or a callable metric)."""

T = TypeVar("T")


@dataclass(frozen=True)
class AccuracyBudget:
    """The error tuning may introduce, held on the whole model's outputs.

    Each module's candidate is first admitted on its own outputs; the plan is then checked end
    to end on the tuning inputs and on the ``holdout`` share of the dataset that was not used
    to choose (at least one input when there are two or more). Hold out inputs like the tuning
    ones: a held-out call of a shape outside the tuned ranges runs the original forward and
    checks nothing. (The time a tune may take is ``auto_tune``'s ``time_budget``.)

    Args:
        max_error: The largest ``metric`` between the tuned model's outputs and fp32 eager's,
            on every call.
        metric: ``"rel_l2"``, ``"max_abs"``, ``"cosine"`` or a callable
            ``fn(eager_output, candidate_output) -> float`` (:mod:`tunetree.accuracy.metrics`).
        max_drop: With ``evaluate``, how far the task score may fall from the untuned model's.
        evaluate: ``evaluate(model) -> float``, higher is better, called on the untuned and the
            tuned model. At least one of ``max_error`` and ``max_drop`` must be given.
        module_max_error: The limit each module's candidate is admitted under, in ``metric``
            when it is a name, else in ``rel_l2`` (default: ``max_error``, else
            :data:`DEFAULT_MODULE_MAX_ERROR`).
        holdout: The share of the dataset kept back to check plans on.

    Raises:
        InvalidInputError: Neither bound given, a negative or NaN bound, ``max_drop`` and
            ``evaluate`` not given together, an unknown metric, or a ``holdout`` outside
            [0, 1).

    Example:
        >>> import tunetree as tt
        >>> budget = tt.AccuracyBudget(max_error=1e-2)
        >>> budget.module_max_error is None, budget.holdout
        (True, 0.25)
    """

    max_error: float | None = None
    metric: Metric = "rel_l2"
    max_drop: float | None = None
    evaluate: Callable[[Any], float] | None = None
    module_max_error: float | None = None
    holdout: float = 0.25

    def __post_init__(self) -> None:
        check_metric(self.metric)
        for name in ("max_error", "max_drop", "module_max_error"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value >= 0):
                raise InvalidInputError(f"{name} must be a number >= 0, not {value!r}")
            if value is not None and math.isnan(value):
                raise InvalidInputError(f"{name} must be a number >= 0, not NaN")
        if self.max_error is None and self.max_drop is None:
            raise InvalidInputError(
                "an AccuracyBudget needs max_error (an output error) or max_drop with evaluate= "
                "(a task metric), e.g. tt.AccuracyBudget(max_error=1e-2)"
            )
        if (self.max_drop is None) != (self.evaluate is None):
            raise InvalidInputError(
                "max_drop and evaluate= go together: evaluate(model) -> score is the task metric "
                "whose drop max_drop bounds"
            )
        if self.evaluate is not None and not callable(self.evaluate):
            raise InvalidInputError("evaluate must be a callable(model) -> float")
        if not (isinstance(self.holdout, int | float) and 0 <= self.holdout < 1):
            raise InvalidInputError(f"holdout must be a share in [0, 1), not {self.holdout!r}")

    @property
    def module_metric(self) -> str:
        """The metric a module's own outputs are checked with."""
        return self.metric if isinstance(self.metric, str) else "rel_l2"

    @property
    def module_limit(self) -> float:
        """The largest error a module's candidate may have on its own outputs."""
        if self.module_max_error is not None:
            return float(self.module_max_error)
        if self.max_error is not None and isinstance(self.metric, str):
            return float(self.max_error)
        return DEFAULT_MODULE_MAX_ERROR

    def split(self, items: Sequence[T]) -> tuple[list[T], list[T]]:
        """The tuning items and the held-out ones (the last ``holdout`` share, at least one).

        A single item is both tuned on and not held out: there is nothing left to hold out.
        """
        items = list(items)
        if len(items) < 2 or self.holdout == 0:
            return items, []
        held = min(len(items) - 1, max(1, round(len(items) * self.holdout)))
        return items[:-held], items[-held:]

    def describe(self) -> str:
        """The budget in words, e.g. ``rel_l2 <= 0.01 of the outputs vs fp32 eager``."""
        parts = []
        if self.max_error is not None:
            parts.append(f"{metric_name(self.metric)} <= {self.max_error:g} vs fp32 eager")
        if self.max_drop is not None:
            name = metric_name(self.evaluate) if self.evaluate is not None else "score"
            parts.append(f"{name} drop <= {self.max_drop:g}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The budget as JSON data (a callable is recorded by name), for checkpoints."""
        return {
            "metric": metric_name(self.metric),
            "max_error": self.max_error,
            "max_drop": self.max_drop,
            "evaluate": metric_name(self.evaluate) if self.evaluate is not None else None,
            "module_max_error": self.module_limit,
            "holdout": self.holdout,
        }
