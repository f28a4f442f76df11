"""Why auto_tune kept the untuned model, in one line (a fleet row and a log line carry it)."""

from __future__ import annotations

import pytest
import torch

import tunetree as tt
from tests.fakes import mlp
from tunetree.candidates.budget import TIME_BUDGET_ERROR
from tunetree.search.auto_result import AutoTuneResult, DepthRow, DepthStatus
from tunetree.search.untuned import why_untuned


def _result(depth: int | None, *rows: DepthRow) -> AutoTuneResult:
    return AutoTuneResult(torch.nn.Identity(), depth, list(rows), None)


def test_a_reason_shared_by_every_depth_is_said_once() -> None:
    skipped = [DepthRow(d, 1, 1, DepthStatus.SKIPPED, error=TIME_BUDGET_ERROR) for d in (0, 1)]
    assert why_untuned(_result(None, *skipped)) == f"every depth: skipped: {TIME_BUDGET_ERROR}"


def test_depths_slower_than_the_untuned_model_say_their_speedups() -> None:
    measured = DepthRow(0, 1, 1, DepthStatus.MEASURED, speedup=0.97)
    twin = DepthRow(1, 1, 1, DepthStatus.SAME_CUT, speedup=0.97, same_as=0)
    failed = DepthRow(2, 3, 3, DepthStatus.FAILED, error="RuntimeError: no")
    assert why_untuned(_result(None, measured, twin, failed)) == (
        "no depth beat the untuned model: depth 0: 0.97x, measured; "
        "depth 1: same cut as depth 0; depth 2: failed: RuntimeError: no"
    )


def test_a_tuned_result_has_no_reason() -> None:
    assert why_untuned(_result(0, DepthRow(0, 1, 1, DepthStatus.MEASURED, speedup=1.5))) == ""


@pytest.mark.usefixtures("virtual_time")
def test_an_eager_only_tune_says_every_graph_kept_eager() -> None:
    result = tt.auto_tune(
        mlp(),
        [torch.randn(4, 16)],
        max_depth=1,
        strategy=tt.OneBackendStrategy(tt.backends.Eager()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    assert result.depth is None
    assert why_untuned(result).startswith("every depth: no change: every graph kept eager"), str(
        result
    )
