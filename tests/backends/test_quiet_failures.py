"""Issue 31, item 3: a failed export logs one line (all of it at debug level) and prints
nothing. The TorchScript exporter writes the IR of a graph it failed on straight to file
descriptor 1 from C++ (402 lines for Mixtral, with the machine's file paths), past
``sys.stdout``."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from torch import nn

import tunetree as tt
from tunetree.backends.export_context import quiet
from tunetree.candidates.evaluate import Status

pytest.importorskip("onnxruntime")


@torch.library.custom_op("tunetree_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Unexportable(nn.Module):
    """An operator no ONNX exporter knows: both exporters fail, the TorchScript one loudly."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return twice(self.lin(x))


def test_quiet_keeps_native_writes_off_the_terminal_and_in_the_debug_log(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tunetree.backends.export_context")
    with quiet():
        os.write(1, b"native noise on stdout\n")
        os.write(2, b"native noise on stderr\n")
        torch._C._jit_onnx_log("the onnx log")
        print("python noise")
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert "native noise on stdout" in caplog.text and "native noise on stderr" in caplog.text
    assert "python noise" in caplog.text
    print("after")  # the descriptors are back
    assert capfd.readouterr().out == "after\n"


def test_a_failed_export_prints_nothing_and_logs_one_line(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tunetree")
    result = tt.tune(
        Unexportable().eval(),
        [torch.randn(2, 4)],
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    row = result.graphs[0].rows[0]
    assert row.status is Status.FAILED and "\n" not in row.reason
    out, err = capfd.readouterr()
    assert "Torch IR graph" not in out + err and "graph(" not in out + err
    assert out == ""
    failed = [r for r in caplog.records if "failed" in r.getMessage() and r.levelno >= logging.INFO]
    assert len(failed) == 1 and "\n" not in failed[0].getMessage()


class GatherOutOfRange(tt.backends.OnnxRuntime):
    """ONNX Runtime whose runner's model fails inside ONNX Runtime on every call (a GatherND
    of an index past the data), as an exported graph that does not hold on a check sample."""

    name = "test-ort-gather"

    def build(self, module, graph, device):
        import onnx
        from onnx import TensorProto, helper

        from tunetree.backends.onnxruntime import MODEL_FILE

        runner = super().build(module, graph, device)
        first = runner.session.get_inputs()[0].name
        outputs = [o.name for o in runner.session.get_outputs()]
        index = helper.make_tensor("index", TensorProto.INT64, [1, 1], [99])
        nodes = [helper.make_node("GatherND", [first, "index"], [outputs[0]])]
        graph_proto = helper.make_graph(
            nodes,
            "broken",
            [helper.make_tensor_value_info(first, TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info(outputs[0], TensorProto.FLOAT, None)],
            [index],
        )
        model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
        onnx.save(model, str(runner.directory / MODEL_FILE))
        runner.session = runner._session(self.session_options())
        runner.feeds = [(first, 0)]
        return runner


def test_a_candidate_failing_inside_onnxruntime_writes_no_native_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """ONNX Runtime's C++ logger writes ``[E:onnxruntime:...] Non-zero status code ...`` to file
    descriptor 2 when a call fails; while a candidate is checked that must stay off the
    terminal, and the message must be in the candidate's row."""
    model = nn.Sequential(nn.Linear(4, 4)).eval()
    result = tt.tune(
        model,
        [torch.randn(2, 4)],
        strategy=tt.OneBackendStrategy(GatherOutOfRange()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    rows = {r.backend.name: r for r in result.graphs[0].rows}
    row = rows["test-ort-gather"]
    assert row.status is tt.Status.FAILED
    assert "GatherND" in row.reason
    out, err = capfd.readouterr()
    assert "onnxruntime" not in out + err and "Non-zero status" not in out + err
