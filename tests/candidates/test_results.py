"""GraphResult.release_runners: losers keep no session or thread pool, device graphs stay."""

from __future__ import annotations

from typing import Any

from tests.fakes import Delayed
from tunetree.backends.base import Runner
from tunetree.candidates.evaluate import CandidateRow, Status
from tunetree.candidates.measure import Timing
from tunetree.candidates.results import GraphResult


class _Held(Runner):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return None


class _Capture(_Held):
    releasable = False  # as a device graph's runner


def _row(label: str, median_s: float, runner: Runner) -> CandidateRow:
    timing = Timing(median_s, median_s, median_s, median_s, 3, 1)
    return CandidateRow(runner.backend, Status.OK, timing=timing, runner=runner)


def _result() -> tuple[GraphResult, dict[str, Runner]]:
    a, b = Delayed(label="a"), Delayed(label="b")  # one kind: b is slower than a
    runners: dict[str, Runner] = {
        "fast": _Held(a),
        "slow": _Held(b),
        "capture": _Capture(b),
    }
    rows = [_row("fast", 1.0, runners["fast"]), _row("slow", 2.0, runners["slow"])]
    rows.append(_row("capture", 3.0, runners["capture"]))
    return GraphResult("", None, rows, rows[0]), runners  # type: ignore[arg-type]


def test_losers_are_dropped_but_each_kinds_fastest_and_device_graphs_stay() -> None:
    result, runners = _result()
    assert result.release_runners() == 1
    kept = {id(r.runner) for r in result.rows if r.runner is not None}
    assert kept == {id(runners["fast"]), id(runners["capture"])}
    assert result.rows[1].status is Status.OK  # the row keeps its outcome and timing
    assert result.rows[1].timing is not None


def test_only_what_a_plan_serves_is_kept_and_a_capture_is_never_dropped() -> None:
    result, runners = _result()
    assert result.release_runners(keep=[runners["slow"]]) == 1
    kept = {id(r.runner) for r in result.rows if r.runner is not None}
    assert kept == {id(runners["slow"]), id(runners["capture"])}


def test_device_graph_runners_are_not_releasable() -> None:
    from tunetree.backends.device_graph import DeviceGraphRunner, ShapeSetRunner

    assert not DeviceGraphRunner.releasable and not ShapeSetRunner.releasable
    assert _Held.releasable  # every other runner may be dropped
