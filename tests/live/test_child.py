"""tt.jit's cold tune in a child process: built there, loaded and checked here, never blocking."""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import tunetree as tt
from tunetree.live.child import (
    MAX_OUTCOME_BYTES,
    ChildJob,
    ChildOutcome,
    ChildTune,
    _outcome,
    why_not_in_child,
)

from . import fakes
from .test_jit import eager, limits, same, serve

tuner_module = importlib.import_module("tunetree.live.tuner")


@pytest.fixture(autouse=True)
def _fresh_fakes():
    fakes.BUILDS.clear()
    fakes.RUNS.clear()
    yield
    tuner_module._wait_at_exit()


def test_a_cold_tune_builds_in_a_child_process_and_its_plan_serves_here(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, asked = tuner_module.auto_tune, []

    def watched(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(tuner_module, "auto_tune", watched)
    caplog.set_level(logging.INFO, logger="tunetree.live")
    served = tt.jit(fakes.model(), cache=tmp_path, limits=limits(), **fakes.options())
    assert same(serve(served, [1, 2, 3, 4]), eager([1, 2, 3, 4]))
    assert served.wait(timeout=240), served.reason
    assert fakes.BUILDS == []  # nothing was built in this process...
    assert served.builds >= 1  # ...the child built it
    assert any("child process (pid" in r.getMessage() for r in caplog.records)
    # Here the child's plan is loaded as it is: no auto_tune (no search, no measurement).
    assert asked == []
    assert served.result is not None and served.result.rows[0].status.name == "RECORDED"
    fakes.RUNS.clear()
    assert same(serve(served, [2]), eager([2]))
    assert fakes.runs_here() == 1  # served by the runner loaded from the child's cache entry


def test_the_childs_plan_loads_here_with_no_build_when_its_race_was_cut_short(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tunetree")
    served = tt.jit(fakes.model(), cache=tmp_path, limits=limits(), **fakes.budget_cut_options())
    serve(served, [1, 2, 3, 4])
    assert served.wait(timeout=240), served.reason
    assert fakes.BUILDS == []  # the child built Fast; this process loaded it from the cache
    # At DEBUG the child's own log comes back: its builds, the skipped one, the partial store.
    [child_log] = [r.getMessage() for r in caplog.records if "the child's log" in r.getMessage()]
    assert "test-live-fast" in child_log and "building" in child_log
    assert served.result is not None and served.result.depth == 0
    assert [r.status.name for r in served.result.rows] == ["RECORDED"]
    fakes.RUNS.clear()
    assert same(serve(served, [2]), eager([2]))
    assert fakes.runs_here() == 1


class Local(fakes.Slow):
    """Importable by name: only the model made in a test function below is not."""


def test_what_a_fresh_interpreter_cannot_unpickle_is_named() -> None:
    class Inner(fakes.Slow):
        pass

    cache = tt.TuningCache(Path("/nonexistent-but-unused"), remote=False)
    assert why_not_in_child(Local(), None, {}, cache) is None
    assert "inside a function" in str(why_not_in_child(Inner(), None, {}, cache))
    assert "call function" in str(why_not_in_child(Local(), lambda m, x: m(x), {}, cache))
    assert "no tuning cache" in str(why_not_in_child(Local(), None, {}, False))
    assert "options" in str(why_not_in_child(Local(), None, {"x": lambda: 1}, cache))


def test_a_model_a_fresh_interpreter_cannot_rebuild_tunes_in_a_thread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Inner(fakes.Slow):
        pass

    torch.manual_seed(0)
    caplog.set_level(logging.INFO, logger="tunetree.live")
    served = tt.jit(Inner().eval(), cache=tmp_path, limits=limits(), **fakes.options())
    serve(served, [1, 2, 3, 4])
    assert served.wait(timeout=120), served.reason
    assert fakes.BUILDS == ["Inner"]  # built here
    assert any("tuning in a thread of this process" in r.getMessage() for r in caplog.records)


def test_a_child_that_cannot_load_its_job_falls_back_to_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ghost = types.ModuleType("tests_live_ghost")  # importable here, not in a fresh interpreter

    class Ghost(fakes.Slow):
        pass

    Ghost.__module__, Ghost.__qualname__ = ghost.__name__, "Ghost"
    ghost.Ghost = Ghost  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, ghost.__name__, ghost)
    torch.manual_seed(0)
    caplog.set_level(logging.INFO, logger="tunetree.live")
    served = tt.jit(Ghost().eval(), cache=tmp_path, limits=limits(), **fakes.options())
    serve(served, [1, 2, 3, 4])
    assert served.wait(timeout=240), served.reason
    assert fakes.BUILDS == ["Ghost"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("child process did not tune" in m and "could not load" in m for m in messages)


def test_undo_stops_a_child_still_tuning(tmp_path: Path) -> None:
    options = {**fakes.options(), "strategy": tt.MinLatencyStrategy([SlowToBuild()])}
    served = tt.jit(fakes.model(), cache=tmp_path, limits=limits(), **options)
    serve(served, [1, 2, 3, 4])
    tuner = served.tuner
    assert tuner is not None
    deadline = time.monotonic() + 60
    while (tuner._child is None or tuner._child._proc is None) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = tuner._child
    assert child is not None and child._proc is not None
    proc = child._proc
    served.undo()
    assert proc.wait(timeout=10) != 0  # killed, long before its 60 s build ends
    assert served.status == "untuned"


def test_a_child_stopped_before_it_started_is_killed_not_waited_for(tmp_path: Path) -> None:
    options = {**fakes.options(), "strategy": tt.MinLatencyStrategy([SlowToBuild()])}
    job = ChildJob(fakes.model(), fakes.calls([1, 2]), None, options, str(tmp_path), None, 1, 0)
    tune = ChildTune(job, None)
    tune.kill()  # e.g. undo() while the job was being written
    outcome = tune.run()
    assert outcome.failed and outcome.reason == "stopped"
    assert tune._proc is not None and tune._proc.returncode != 0  # killed, not run to its end


class SlowToBuild(fakes.Fast):
    """A build that takes a minute (in the child): long enough to be stopped."""

    def build(self, module: Any, graph: Any, device: Any) -> Any:
        time.sleep(60)
        return super().build(module, graph, device)


@pytest.mark.parametrize(
    "raw",
    [
        b"[1]",
        b'{"depth": "2"}',
        b'{"depth": true}',
        b'{"depth": -1}',
        b'{"depth": 1, "builds": "3"}',
        b'{"depth": 1, "reason": 5}',
        b"{",
        json.dumps({"depth": 1, "reason": "x" * MAX_OUTCOME_BYTES}).encode(),
        b'{"depth": 1, "plan": {"depth": 1, "graphs": []}}',
        b'{"depth": 1, "plan": {"depth": 2, "graphs": [{"path": "", "graph": "'
        + b"a" * 64
        + b'", "backend": {"kind": "eager"}}]}}',
        b'{"depth": 1, "plan": {"depth": 1, "graphs": [{"path": "", "graph": "../x", '
        b'"backend": {"kind": "eager"}}]}}',
    ],
)
def test_a_malformed_outcome_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        _outcome(raw)


def test_an_outcome_is_read_field_by_field() -> None:
    assert _outcome(b'{"depth": 0, "builds": 2, "reason": "", "failed": false}') == ChildOutcome(
        0, 2, "", False
    )
