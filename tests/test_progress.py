"""Progress goes through ``logging``: the application's configuration decides what is shown;
with none, verbose steps reach stderr through a handler of the library's own, installed on no
logger (the root logger least of all)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import Delayed

QUICK = tt.MeasureConfig.quick()


def _tune(verbose: bool = True) -> None:
    tt.tune(
        nn.Sequential(nn.Linear(4, 4)).eval(),
        [torch.randn(2, 4)],
        strategy=tt.OneBackendStrategy(Delayed(0.0)),
        measure_config=QUICK,
        verbose=verbose,
        cache=False,
    )


def unconfigured(monkeypatch: pytest.MonkeyPatch) -> None:
    """No handler anywhere: as in a script that never configured logging (pytest adds its
    own to the root logger around each phase, so this is called in the test's body)."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])


def test_unconfigured_logging_shows_verbose_progress_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    unconfigured(monkeypatch)
    root = logging.getLogger()
    level = root.level
    _tune()
    err = capsys.readouterr().err
    assert "[tunetree" in err and "building" in err
    assert root.handlers == [] and root.level == level
    assert logging.getLogger("tunetree.progress").handlers == []
    _tune(verbose=False)
    assert capsys.readouterr().err == ""


def test_a_level_on_the_tunetree_logger_silences_it_without_handlers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    unconfigured(monkeypatch)
    logger = logging.getLogger("tunetree")
    old = logger.level
    logger.setLevel(logging.WARNING)
    try:
        _tune()
    finally:
        logger.setLevel(old)
    assert "[tunetree" not in capsys.readouterr().err


def test_configured_logging_decides(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.INFO, logger="tunetree.progress"):
        _tune()
    steps = [r for r in caplog.records if r.name == "tunetree.progress"]
    assert steps and all(r.levelno == logging.INFO for r in steps)
    assert any("building" in r.getMessage() for r in steps)
    assert "[tunetree" not in capsys.readouterr().err  # the handler configured, not a print
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tunetree.progress"):
        _tune()
    assert not [r for r in caplog.records if r.name == "tunetree.progress"]
    with caplog.at_level(logging.DEBUG, logger="tunetree.progress"):
        _tune(verbose=False)
    quiet = [r for r in caplog.records if r.name == "tunetree.progress"]
    assert quiet and all(r.levelno == logging.DEBUG for r in quiet)
