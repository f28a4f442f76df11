"""What a checkpoint says is never believed (issue 29): each runner ``tt.load`` rebuilds is
checked against eager on the model's own weights before it serves, a runner's kind and the
plan's "results kept" come from the content, and an accuracy record is measured again.
Every file is a real checkpoint edited with its checksums recomputed (:mod:`.hostile`)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tunetree as tt
from tests.cache.poison import rank_one
from tests.checkpoint.fixtures.make_fixtures import inputs, model
from tests.checkpoint.hostile import (
    SOURCE,
    _records_backend,
    as_recorded,
    autocast_file,
    openvino_weights,
    rewrite,
)
from tunetree.cli import main as cli_main

needs_openvino = pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None, reason="the fixture holds OpenVINO runners"
)


def _load(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    as_recorded(path, monkeypatch)
    return tt.load(model(), path)


def _unseen() -> torch.Tensor:
    return torch.randn(2, 8, generator=torch.Generator().manual_seed(99))


# --- the weights inside a runner's artifact ----------------------------------------------------


@needs_openvino
def test_the_untouched_checkpoint_loads_and_keeps_results(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        tuned = _load(SOURCE, monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(tuned(_unseen()), model()(_unseen()), atol=1e-5, rtol=1e-5)
    assert "changes results" not in caplog.text


@needs_openvino
def test_openvino_weights_scaled_in_the_artifact_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every weight of the first runner's IR x1.5, re-hashed: before, it loaded and was off by
    about 1.5 from eager on the loaded weights."""
    path = openvino_weights(0, lambda a, shape: (a * 1.5).astype(np.float32))(tmp_path / "a.tt")
    with pytest.raises(tt.CheckpointError, match="does not match eager on the model's own"):
        _load(path, monkeypatch)


@needs_openvino
def test_openvino_weights_changed_where_the_tuning_inputs_cannot_see_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first Linear's weight plus a rank-one update in the null space of the recorded
    inputs: outputs on those inputs are eager's exactly, and off on any other; before, the
    file loaded silently."""
    seen = torch.cat(inputs())

    def poison(array: Any, shape: tuple[int, ...]) -> Any:
        if shape != (16, 8):
            return array
        return rank_one(torch.from_numpy(array), seen).numpy()

    path = openvino_weights(0, poison)(tmp_path / "a.tt")
    with pytest.raises(tt.CheckpointError, match="does not match eager"):
        _load(path, monkeypatch)


# --- Autocast records --------------------------------------------------------------------------


def test_autocast_dtypes_that_do_not_fit_the_outputs_are_refused_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 5: three output dtypes for the model's one output. Before, the file loaded and
    every call of that graph raised."""
    path = autocast_file(["f32", "f32", "f32"])(tmp_path / "a.tt")
    with pytest.raises(tt.BackendError, match="lists 3 output dtypes, but the module returns 1"):
        _load(path, monkeypatch)


def test_a_results_changing_plan_without_an_accuracy_record_is_labelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 6: a bf16 Autocast entry and no accuracy record. Before, it loaded with no
    warning; now the load says the plan changes results, with the error it measured."""
    path = autocast_file(["f32"])(tmp_path / "a.tt")
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        tuned = _load(path, monkeypatch)
    assert "changes results though the file records no accuracy budget" in caplog.text
    assert "autocast rel_l2" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(tuned(_unseen()), model()(_unseen()), atol=5e-2, rtol=5e-2)


# --- an int8 ONNX plan ---------------------------------------------------------------------------


@pytest.fixture
def int8_source(int8_checkpoint: Path) -> Path:
    """A real checkpoint of the fixture's model tuned whole with ONNX Runtime int8."""
    return int8_checkpoint


def _as_onnxruntime(m: dict[str, Any]) -> None:
    m["entries"][0]["backend"] = {
        "kind": "onnxruntime",
        "name": "onnxruntime",
        "config": {"graph_optimization_level": "all", "intra_op_num_threads": None,
                   "inter_op_num_threads": None, "allow_spinning": False, "providers": None},
    }  # fmt: skip


def test_int8_content_under_a_results_keeping_kind_is_refused_by_load_and_info(
    int8_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 6: the int8 model (MatMulInteger) recorded as a plain ``onnxruntime`` runner.
    Before, it loaded silently, off by 0.015 from eager, and info called it compatible."""
    path = rewrite(
        tmp_path / "a.tt",
        manifest=_as_onnxruntime,
        record=_records_backend("onnxruntime"),
        source=int8_source,
    )
    with pytest.raises(tt.BackendError, match=r"holds quantized nodes \(\w+\)"):
        _load(path, monkeypatch)
    assert cli_main(["info", str(path)]) == 2


def _accuracy(changes: bool, module_limit: float) -> Any:
    def edit(m: dict[str, Any]) -> None:
        m["accuracy"] = {
            "budget": {"metric": "rel_l2", "max_error": module_limit, "max_drop": None,
                       "evaluate": None, "module_max_error": module_limit, "holdout": 0.25},
            "error": 1e-3, "heldout_error": None, "score_drop": None,
            "changes_results": changes,
        }  # fmt: skip

    return edit


def test_a_record_claiming_results_kept_is_corrected_by_the_content(
    int8_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Finding 6: ``changes_results: false`` on an int8 plan. Before, the load logged
    "results kept"."""
    path = rewrite(tmp_path / "a.tt", manifest=_accuracy(False, 0.5), source=int8_source)
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        _load(path, monkeypatch)
    assert "results kept" not in caplog.text
    assert "changes results though its accuracy record claims it keeps them" in caplog.text


def test_a_deleted_accuracy_record_is_noticed(
    int8_source: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 6: an int8 plan with no accuracy record (deleted, or never written): before,
    no warning."""
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        _load(int8_source, monkeypatch)
    assert "changes results though the file records no accuracy budget" in caplog.text
    assert "onnxruntime-int8 rel_l2" in caplog.text


def test_the_accuracy_record_is_measured_again_at_load(
    int8_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget whose module limit the int8 runner cannot hold on this model's weights: the
    record's claim is checked, not believed."""
    path = rewrite(tmp_path / "a.tt", manifest=_accuracy(True, 1e-9), source=int8_source)
    with pytest.raises(tt.CheckpointError, match="over the module limit 1e-09"):
        _load(path, monkeypatch)
    path = rewrite(tmp_path / "b.tt", manifest=_accuracy(True, 0.5), source=int8_source)
    assert _load(path, monkeypatch) is not None
