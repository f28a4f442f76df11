"""Accuracy budgets: trade a stated error for speed, per module, held end to end.

:class:`AccuracyBudget` says what error the user accepts (:mod:`.metrics` measures it),
:mod:`.repair` fits a plan into it one graph at a time, and :class:`Pareto` reports every plan
checked. ``tt.auto_tune(model, data, accuracy=budget)`` uses all three.
"""

from .budget import DEFAULT_MODULE_MAX_ERROR, AccuracyBudget
from .metrics import METRICS, Metric, call_error, metric_name, output_error
from .pareto import Pareto, steps_table
from .repair import GraphId, PlanStep, Verdict, repair, results_kept

__all__ = [
    "DEFAULT_MODULE_MAX_ERROR",
    "METRICS",
    "AccuracyBudget",
    "GraphId",
    "Metric",
    "Pareto",
    "PlanStep",
    "Verdict",
    "call_error",
    "metric_name",
    "output_error",
    "repair",
    "results_kept",
    "steps_table",
]
