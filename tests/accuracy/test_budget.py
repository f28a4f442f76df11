from __future__ import annotations

import pytest

import tunetree as tt
from tunetree.accuracy import DEFAULT_MODULE_MAX_ERROR


def test_a_budget_needs_a_bound() -> None:
    with pytest.raises(tt.InvalidInputError, match="needs max_error"):
        tt.AccuracyBudget()
    with pytest.raises(tt.InvalidInputError, match="go together"):
        tt.AccuracyBudget(max_drop=0.01)
    with pytest.raises(tt.InvalidInputError, match="go together"):
        tt.AccuracyBudget(max_error=0.01, evaluate=lambda m: 1.0)
    with pytest.raises(tt.InvalidInputError, match="metric must be"):
        tt.AccuracyBudget(max_error=0.01, metric="l7")
    with pytest.raises(tt.InvalidInputError, match=">= 0"):
        tt.AccuracyBudget(max_error=-1)
    with pytest.raises(tt.InvalidInputError, match="not nan"):
        tt.AccuracyBudget(max_error=float("nan"))
    with pytest.raises(tt.InvalidInputError, match="holdout"):
        tt.AccuracyBudget(max_error=0.01, holdout=1.0)


def test_module_limit_follows_the_budget_metric() -> None:
    assert tt.AccuracyBudget(max_error=1e-2).module_limit == 1e-2
    assert tt.AccuracyBudget(max_error=1e-2, module_max_error=3e-2).module_limit == 3e-2
    task = tt.AccuracyBudget(max_drop=0.01, evaluate=lambda m: 1.0)
    assert task.module_limit == DEFAULT_MODULE_MAX_ERROR
    assert task.module_metric == "rel_l2"
    custom = tt.AccuracyBudget(max_error=0.1, metric=lambda r, c: 0.0)
    assert custom.module_metric == "rel_l2"
    assert custom.module_limit == DEFAULT_MODULE_MAX_ERROR


def test_split_holds_out_the_last_share() -> None:
    budget = tt.AccuracyBudget(max_error=1e-2, holdout=0.25)
    assert budget.split(list(range(8))) == ([0, 1, 2, 3, 4, 5], [6, 7])
    assert budget.split([1, 2]) == ([1], [2])
    assert budget.split([1]) == ([1], [])
    assert tt.AccuracyBudget(max_error=1e-2, holdout=0).split([1, 2, 3]) == ([1, 2, 3], [])


def test_describe_and_record() -> None:
    def top1(model):
        return 1.0

    budget = tt.AccuracyBudget(max_error=1e-2, max_drop=0.005, evaluate=top1)
    assert budget.describe() == "rel_l2 <= 0.01 vs fp32 eager, top1 drop <= 0.005"
    record = budget.to_json()
    assert record["evaluate"] == "top1"
    assert record["module_max_error"] == 1e-2
