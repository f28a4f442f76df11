"""Small models and graph helpers shared by the tests of exporting backends (OpenVINO, ONNX
Runtime): an MLP, a TransformerEncoder, a CNN, a Hugging Face BERT built from a config, and
modules with awkward inputs and outputs."""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tunetree.backends.base import Runner
from tunetree.signature.compare import compare_all
from tunetree.signature.graph import Graph, Sample, flatten

CPU = torch.device("cpu")


def graph_of(module: nn.Module, samples: list[Sample]) -> Graph:
    """The graph eager records for ``samples`` (all of one signature)."""
    with torch.no_grad():
        outputs = [module(*s.args, **s.kwargs) for s in samples]
    return Graph(key=samples[0].key, samples=samples, outputs=outputs)


def run_all(runner: Runner, graph: Graph) -> list[Any]:
    with torch.no_grad():
        return [runner(*s.args, **s.kwargs) for s in graph.samples]


def assert_same(a: Any, b: Any) -> None:
    """Same structure, types and bit-identical tensors."""
    leaves_a, spec_a = flatten(a)
    leaves_b, spec_b = flatten(b)
    assert spec_a == spec_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
        else:
            assert x == y


def mlp(width: int = 64, depth: int = 4, batch: int = 4) -> tuple[nn.Module, list[Sample]]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    module = nn.Sequential(*layers).eval()
    return module, [Sample((torch.randn(batch, width),)) for _ in range(2)]


def encoder(d: int = 32, seq: int = 8, batch: int = 2) -> tuple[nn.Module, list[Sample]]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d, 4, dim_feedforward=2 * d, batch_first=True)
    module = nn.TransformerEncoder(layer, 4).eval()
    return module, [Sample((torch.randn(batch, seq, d),)) for _ in range(2)]


def cnn(batch: int = 2, size: int = 16) -> tuple[nn.Module, list[Sample]]:
    torch.manual_seed(0)
    module = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    ).eval()
    return module, [Sample((torch.randn(batch, 3, size, size),)) for _ in range(2)]


def bert(
    hidden: int = 64, layers: int = 2, batch: int = 2, seq: int = 16
) -> tuple[nn.Module, list[Sample]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        vocab_size=1000,
    )
    module = transformers.BertModel(config).eval()
    samples = []
    for _ in range(2):
        ids = torch.randint(0, 1000, (batch, seq))
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[-1, seq // 2 :] = 0
        samples.append(Sample((), {"input_ids": ids, "attention_mask": mask}))
    return module, samples


MODELS: dict[str, Callable[[], tuple[nn.Module, list[Sample]]]] = {
    "mlp": mlp,
    "encoder": encoder,
    "cnn": cnn,
    "bert": bert,
}

Pair = collections.namedtuple("Pair", "index positive")


class Awkward(nn.Module):
    """Positional float constant, keyword tensors in any order, a nested non-tensor kwarg, and
    an output mixing a dict, a tuple holding an input, an int, None and a namedtuple."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(
        self,
        x: torch.Tensor,
        scale: float,
        *,
        mask: torch.Tensor | None = None,
        ids: torch.Tensor | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        y = self.lin(x) * scale
        if mask is not None:
            y = y.masked_fill(~mask, 0.0)
        if ids is not None:
            y = y + ids.to(y.dtype)
        return {
            "y": y,
            "pair": (x, y.sum(-1)),
            "count": 3,
            "none": None,
            "nt": Pair(y.argmax(-1), y > 0),
        }


def awkward() -> tuple[nn.Module, list[Sample]]:
    torch.manual_seed(0)
    samples = []
    for _ in range(2):
        x, mask = torch.randn(3, 4), torch.rand(3, 4) > 0.3
        ids = torch.randint(0, 5, (3, 4))
        samples.append(Sample((x, 2.0), {"mask": mask, "ids": ids, "extra": {"k": [1, 2]}}))
    return Awkward().eval(), samples


class DataDependent(nn.Module):
    """Python control flow on a tensor value: ``torch.export`` refuses it, tracing fixes the
    branch taken by the sample."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.lin(x)
        return -self.lin(x)


def data_dependent() -> tuple[nn.Module, list[Sample]]:
    torch.manual_seed(0)
    return DataDependent().eval(), [Sample((torch.rand(3, 4),)) for _ in range(2)]


def hide_packages(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``importlib.util.find_spec`` report ``names`` as not installed."""
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        if name.split(".")[0] in names:
            return None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def parameter_snapshot(module: nn.Module) -> dict[str, tuple[int, torch.Tensor]]:
    return {
        name: (t.data_ptr(), t.detach().clone())
        for name, t in [*module.named_parameters(), *module.named_buffers()]
    }


def assert_parameters_untouched(module: nn.Module, before: dict[str, Any]) -> None:
    after = dict([*module.named_parameters(), *module.named_buffers()])
    assert after.keys() == before.keys()
    for name, (ptr, value) in before.items():
        assert after[name].data_ptr() == ptr, name
        assert torch.equal(after[name], value), name


def check_conformance(
    backend: Any, model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, list[Any], Path]:
    """What every exporting backend must do on every model: match eager, keep the output
    types (ModelOutput too), not overwrite earlier outputs, write only where told, round-trip
    through save/load, and leave the module's parameters and torch's fast path untouched.
    Returns the runner, its outputs and the directory it saved to."""
    module, samples = MODELS[model]()
    graph = graph_of(module, samples)
    before = parameter_snapshot(module)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    monkeypatch.chdir(tmp_path)  # nothing may be written to the working directory

    runner = backend.build(module, graph, CPU)
    outputs = run_all(runner, graph)
    result = compare_all(graph.outputs, outputs)
    assert result.ok, result.reason
    for eager, got in zip(graph.outputs, outputs, strict=True):
        assert type(got) is type(eager)
    if model == "bert":
        from transformers.utils import ModelOutput

        assert isinstance(outputs[0], ModelOutput)
        assert outputs[0]["last_hidden_state"].shape == graph.outputs[0]["last_hidden_state"].shape

    # A later call must not overwrite what an earlier one returned.
    first = runner(*samples[0].args, **samples[0].kwargs)
    kept = [t.clone() for t in torch.utils._pytree.tree_leaves(first)]
    runner(*samples[1].args, **samples[1].kwargs)
    for a, b in zip(torch.utils._pytree.tree_leaves(first), kept, strict=True):
        assert torch.equal(a, b)

    saved = tmp_path / "saved"
    saved.mkdir()
    saved_record = runner.save(saved)
    json.dumps(saved_record)
    assert sorted(os.listdir(tmp_path)) == ["saved"]
    loaded = backend.load(module, graph.key, saved, saved_record, CPU)
    for a, b in zip(outputs, run_all(loaded, graph), strict=True):
        assert_same(a, b)

    assert_parameters_untouched(module, before)
    assert torch.backends.mha.get_fastpath_enabled() == fastpath
    assert not module.training
    return runner, outputs, saved
