"""Backends built for a ranged graph: one runner serves every shape in the range (recorded
or not, after save/load too), and the helpers that pick the export example."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tunetree.backends import Eager, OnnxRuntime, OpenVINO
from tunetree.backends.base import Backend, Runner
from tunetree.backends.ranges import (
    axis_dims,
    example_sample,
    example_sizes,
    export_dynamic_shapes,
    resize_sample,
)
from tunetree.signature.compare import compare_all
from tunetree.signature.graph import Dim, Graph, Sample
from tunetree.signature.shapes import group_graphs, probe_sizes

CPU = torch.device("cpu")


def ranged_graph(module: nn.Module, samples: list[Sample]) -> Graph:
    """The one ranged graph eager records for ``samples`` (same structure, sizes vary)."""
    with torch.no_grad():
        calls = [(s, module(*s.args, **s.kwargs)) for s in samples]
    graphs = group_graphs(calls)
    assert len(graphs) == 1
    (graph,) = graphs.values()
    assert graph.key.is_dynamic
    return graph


def mlp_graph() -> tuple[nn.Module, Graph]:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    return module, ranged_graph(module, [Sample((torch.randn(b, 16),)) for b in (1, 4, 16)])


class Masked(nn.Module):
    """Token ids and a mask sharing batch and seq: the Hugging Face form of two ranges."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 12)
        self.proj = nn.Linear(12, 12)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, Any]:
        hidden = self.proj(self.embed(input_ids)) * attention_mask[..., None]
        pooled = hidden.sum(1) / attention_mask.sum(1, keepdim=True).clamp(min=1)
        return {"hidden": hidden, "pooled": pooled}


def tokens(batch: int, seq: int) -> Sample:
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, seq // 2 + 1 :] = 0
    return Sample((), {"input_ids": torch.randint(0, 50, (batch, seq)), "attention_mask": mask})


def masked_graph() -> tuple[nn.Module, Graph]:
    torch.manual_seed(0)
    module = Masked().eval()
    return module, ranged_graph(module, [tokens(b, n) for b, n in ((1, 8), (4, 33), (8, 64))])


def cnn_graph() -> tuple[nn.Module, Graph]:
    torch.manual_seed(0)
    module = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    ).eval()
    return module, ranged_graph(module, [Sample((torch.randn(b, 3, 12, 12),)) for b in (1, 6)])


def unrecorded(graph: Graph) -> list[Sample]:
    """Calls inside the range that were not recorded: every dimension at its min, its max and
    at a prime in between."""
    picks = probe_sizes(graph.key)
    assert len(picks) == 3
    return [resize_sample(graph.samples[-1], graph.key, sizes) for sizes in picks]


def check_serves_the_range(runner: Runner, module: nn.Module, graph: Graph) -> None:
    samples = [*graph.samples, *unrecorded(graph)]
    with torch.no_grad():
        eager = [module(*s.args, **s.kwargs) for s in samples]
        got = [runner(*s.args, **s.kwargs) for s in samples]
    result = compare_all(eager, got)
    assert result.ok, result.reason


GRAPHS = {"mlp": mlp_graph, "masked": masked_graph, "cnn": cnn_graph}


@pytest.mark.parametrize("model", sorted(GRAPHS))
@pytest.mark.parametrize("backend", [OpenVINO(), OnnxRuntime(), Eager()], ids=str)
def test_one_runner_serves_the_range_and_survives_save_load(
    backend: Backend, model: str, tmp_path: Path
) -> None:
    if backend.unavailable_reason(CPU) is not None:
        pytest.skip(str(backend.unavailable_reason(CPU)))
    module, graph = GRAPHS[model]()
    runner = backend.build(module, graph, CPU)
    check_serves_the_range(runner, module, graph)
    saved = runner.save(tmp_path)
    loaded = backend.load(module, graph.key, tmp_path, saved, CPU)
    check_serves_the_range(loaded, module, graph)


def test_openvino_model_has_bounded_dynamic_axes(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    module, graph = masked_graph()
    runner = OpenVINO().build(module, graph, CPU)
    runner.save(tmp_path)
    from tunetree.backends.openvino import _core

    model = _core().read_model(str(tmp_path / "model.xml"))
    shapes = {p.get_any_name(): p.get_partial_shape() for p in model.inputs}
    for shape in shapes.values():
        assert [(d.get_min_length(), d.get_max_length()) for d in shape] == [(1, 8), (8, 64)]


def test_onnx_model_has_dynamic_axes(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    module, graph = mlp_graph()
    runner = OnnxRuntime().build(module, graph, CPU)
    runner.save(tmp_path)
    model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    (first,) = model.graph.input
    dims = first.type.tensor_type.shape.dim
    assert dims[0].dim_param and not dims[0].HasField("dim_value")
    assert dims[1].dim_value == 16


def test_example_sizes_are_at_least_two_and_distinct() -> None:
    dims = {"batch": Dim("batch", 1, 64), "seq": Dim("seq", 1, 512), "one": Dim("one", 2, 3)}
    sizes = example_sizes(dims, {"batch": 1, "seq": 2, "one": 2})
    assert sizes["batch"] >= 2 and sizes["seq"] >= 2
    assert len(set(sizes.values())) == 3
    assert all(dims[n].accepts(v) for n, v in sizes.items())
    # The preferred size is kept where it is usable.
    assert example_sizes(dims, {"batch": 8, "seq": 100, "one": 3}) == {
        "batch": 8,
        "seq": 100,
        "one": 3,
    }


def test_example_sample_resizes_the_largest_recorded_call() -> None:
    _, graph = masked_graph()
    example = example_sample(graph)
    ids, mask = example.kwargs["input_ids"], example.kwargs["attention_mask"]
    assert ids.shape == mask.shape == (8, 64)  # the largest call already fits
    _, graph2 = mlp_graph()
    graph2.samples = graph2.samples[:1]  # only batch 1 recorded: the example is resized to 2
    assert example_sample(graph2).args[0].shape == (2, 16)
    assert torch.equal(example_sample(graph2).args[0][1], graph2.samples[0].args[0][0])


def test_export_dynamic_shapes_follow_the_graph_dims() -> None:
    _, graph = masked_graph()
    (per_input,) = export_dynamic_shapes(graph.key) or ((),)
    assert len(per_input) == 2
    for axes in per_input:
        assert sorted(axes) == [0, 1]
        assert axes[0].__name__ == "batch" and axes[1].__name__ == "seq"
    assert [sorted(a) for a in axis_dims(graph.key)] == [[0, 1], [0, 1]]
    _, static = mlp_graph()
    static.key = static.samples[0].key
    assert export_dynamic_shapes(static.key) is None
