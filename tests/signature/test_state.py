"""Process-wide settings a backend changes are put back (issue 20): the root logger, torch's
flags, the environment."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import ClassVar

import torch
from torch import nn

import tunetree as tt
from tests.fakes import mlp, quick_tune
from tunetree.backends.base import Backend, Runner
from tunetree.candidates.evaluate import Status
from tunetree.signature.graph import Graph
from tunetree.signature.state import ProcessState, process_state_kept


@dataclasses.dataclass(frozen=True)
class Meddling(Backend):
    """Fails its build after changing process-wide settings, as OpenVINO's converter does (it
    sets the root logger to ERROR and restores it only when conversion succeeds)."""

    kind: ClassVar[str] = "fake-meddling"

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        root = logging.getLogger()
        root.setLevel(logging.ERROR)
        root.addHandler(logging.NullHandler())
        torch.set_float32_matmul_precision("medium")
        torch.set_num_threads(1)
        os.environ["TUNETREE_TEST_MEDDLED"] = "1"
        raise RuntimeError("conversion failed")


def test_a_failing_backend_leaves_no_process_setting_changed() -> None:
    before = ProcessState.now()
    result = quick_tune(mlp(), [torch.randn(2, 16)], [Meddling(), tt.backends.Eager()], cache=False)
    (row,) = [r for r in result.graphs[0].rows if r.backend.kind == "fake-meddling"]
    assert row.status is Status.FAILED and "conversion failed" in row.reason
    assert before.changes(ProcessState.now()) == []
    assert "TUNETREE_TEST_MEDDLED" not in os.environ
    result.undo()


def test_process_state_kept_names_what_it_put_back(caplog) -> None:
    level = logging.getLogger().level
    with (
        caplog.at_level(logging.DEBUG, logger="tunetree.signature.state"),
        process_state_kept("test"),
    ):
        logging.getLogger().setLevel(logging.CRITICAL)
    assert logging.getLogger().level == level
    assert "test changed root_level: put back" in caplog.text
