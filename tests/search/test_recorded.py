"""A recorded plan's load (``search.recorded``): which checks it runs, and that they still refuse.

The end-to-end check is skipped only where the graph check already was it (one runner for the
whole model, called as the model, checked on every call at the same tolerances).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
import tunetree.search.recorded as recorded
import tunetree.signature.inspection as inspection
from tests.live import fakes
from tunetree.search.recorded import RecordedPlan, load_recorded

ROWS = [1, 2, 3, 5]
COUNTS: dict[str, int] = {}


def nested(seed: int = 0) -> nn.Module:
    """:class:`fakes.Slow` one level down: the fast backend serves depth 1 only."""
    return nn.Sequential(fakes.model(seed)).eval()


def doubled(model: Any, x: torch.Tensor) -> torch.Tensor:
    return model(x) * 2


def recorded_plan(tmp_path: Path, model: nn.Module, **options: Any) -> RecordedPlan:
    """``model`` tuned on :data:`ROWS` into the cache at ``tmp_path``; the plan it served."""
    result = tt.auto_tune(
        model, fakes.calls(ROWS), cache=tmp_path, verbose=False, **{**fakes.options(), **options}
    )
    plan = RecordedPlan.of(result)
    assert plan is not None, result.decision
    return plan


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many end-to-end checks and untimed first calls a load ran."""
    COUNTS.update(end_to_end=0, first_call=0)
    counts = COUNTS
    output_problem, first_call = recorded.output_problem, inspection._first_call

    def counted_check(*args: Any, **kwargs: Any) -> str:
        counts["end_to_end"] += 1
        return output_problem(*args, **kwargs)

    def counted_first(*args: Any, **kwargs: Any) -> dict[str, str]:
        counts["first_call"] += 1
        return first_call(*args, **kwargs)

    monkeypatch.setattr(recorded, "output_problem", counted_check)
    monkeypatch.setattr(inspection, "_first_call", counted_first)
    return counts


def hooked() -> nn.Module:
    model = fakes.model()
    model.register_forward_hook(lambda module, args, out: out * 3)
    return model


def load(model: nn.Module, plan: RecordedPlan, cache: Path, **options: Any) -> Any:
    """``plan`` loaded for ``model`` (the checks counted from here on)."""
    COUNTS.update(end_to_end=0, first_call=0)
    return load_recorded(
        model,
        fakes.calls(ROWS),
        plan,
        cache=cache,
        call=options.pop("call", None),
        options={**fakes.options(), **options},
    )


def test_a_whole_model_plan_is_checked_once_on_its_calls_and_not_warmed_up(
    tmp_path: Path, checks: dict[str, int]
) -> None:
    """Before: the runner ran twice on every call (the graph check, then end to end on the
    same calls and outputs), after an untimed eager call no check used."""
    plan = recorded_plan(tmp_path, fakes.model())
    assert plan.depth == 0 and [g.path for g in plan.graphs] == [""]
    fakes.RUNS.clear()
    result = load(fakes.model(), plan, tmp_path)
    assert result is not None and result.depth == 0
    assert checks == {"end_to_end": 0, "first_call": 0}
    probes = fakes.runs_here() - len(ROWS)
    assert probes >= 1  # the graph check: every call, then the probes
    assert [p.label for p in result.breakdown.phases if p.label == "end-to-end check"] == []
    x = fakes.calls([4])[0]
    with torch.no_grad():
        assert torch.equal(result.model(x), fakes.model()(x))


def test_a_whole_model_plan_still_refuses_a_runner_that_differs_from_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checks: dict[str, int]
) -> None:
    plan = recorded_plan(tmp_path, fakes.model())

    class Off(fakes.FastRunner):
        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return super().__call__(x) + 1e-2

    monkeypatch.setattr(fakes.Fast, "load", lambda self, module, *a: Off(self, module))
    assert load(fakes.model(), plan, tmp_path) is None


@pytest.mark.parametrize("case", ["root hook", "call", "deeper plan"])
def test_the_end_to_end_check_runs_where_the_graph_check_was_not_it(
    tmp_path: Path, checks: dict[str, int], case: str
) -> None:
    """A hook on the root sees the runner's output, a ``call`` transforms it, and a plan below
    the root leaves code between its runners and the caller: each is checked end to end."""
    if case == "deeper plan":
        plan = recorded_plan(tmp_path, nested(), min_depth=1, max_depth=1)
        assert plan.depth == 1 and [g.path for g in plan.graphs] == ["0"]
        result = load(nested(), plan, tmp_path, min_depth=1, max_depth=1)
    elif case == "call":
        plan = recorded_plan(tmp_path, fakes.model(), call=doubled)
        result = load(fakes.model(), plan, tmp_path, call=doubled)
    else:
        plan = recorded_plan(tmp_path, hooked())
        result = load(hooked(), plan, tmp_path)
    assert result is not None
    assert checks["end_to_end"] == 1
