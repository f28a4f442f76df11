"""TorchAO: quantises a copy (never the user's module), close within its loose tolerances."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tunetree.backends import TorchAO, backend_type, default_backends
from tunetree.backends.registry import BUILTIN_BACKENDS
from tunetree.errors import InvalidInputError
from tunetree.signature.compare import Tolerances, compare_all
from tunetree.signature.graph import Sample

from .export_models import graph_of, run_all

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
has_torchao = importlib.util.find_spec("torchao") is not None
needs_torchao = pytest.mark.skipif(not has_torchao, reason="torchao is not installed")


def _mlp(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return (
        nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU())
        .append(nn.Linear(512, 64))
        .eval()
        .to(device)
    )


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _check(scheme: str, device: torch.device, tmp_path: Path) -> None:
    module = _mlp(device)
    before = _state(module)
    samples = [Sample((torch.randn(16, 256, device=device),)) for _ in range(2)]
    graph = graph_of(module, samples)
    backend = TorchAO(scheme=scheme)
    assert backend.unavailable_reason(device) is None
    inductor_config = torch._inductor.config.get_config_copy()
    runner = backend.build(module, graph, device)
    # torchao must not retune Inductor for the whole process (other candidates compile too).
    assert torch._inductor.config.get_config_copy() == inductor_config
    outputs = run_all(runner, graph)

    close = compare_all(graph.outputs, outputs, backend.tolerances())
    assert close.ok, close.reason
    assert close.max_abs_diff > 0  # quantisation did happen
    assert not compare_all(graph.outputs, outputs, Tolerances()).ok

    # The user's module is untouched: same parameter types and values.
    assert all(type(p) is nn.Parameter for p in module.parameters())
    after = module.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)

    loaded = backend.load(module, graph.key, tmp_path, runner.save(tmp_path), device)
    again = run_all(loaded, graph)
    assert all(torch.equal(a, b) for a, b in zip(outputs, again, strict=True))


def test_config_and_registration() -> None:
    assert TorchAO in BUILTIN_BACKENDS and backend_type("torchao") is TorchAO
    assert not TorchAO.preserves_results and TorchAO.extra == "ao"
    assert all(not isinstance(b, TorchAO) for b in default_backends(CPU))
    assert TorchAO().tolerances() == Tolerances.uniform(5e-2, 5e-2)
    assert TorchAO(scheme="int8-dynamic").name == "torchao(scheme='int8-dynamic')"
    with pytest.raises(InvalidInputError, match="int8-weight-only"):
        TorchAO(scheme="int4")


def test_missing_torchao_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "torchao" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    reason = TorchAO().unavailable_reason(CPU)
    assert reason == "torchao is not installed: pip install 'tunetree[ao]'"


def test_float8_needs_a_recent_gpu() -> None:
    reason = TorchAO(scheme="float8-dynamic").unavailable_reason(CPU)
    if has_torchao:
        assert reason is not None and "8.9" in reason


@needs_torchao
@pytest.mark.parametrize("scheme", ["int8-weight-only", "int8-dynamic"])
def test_int8_on_cpu(scheme: str, tmp_path: Path) -> None:
    _check(scheme, CPU, tmp_path)


@needs_torchao
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scheme", ["int8-weight-only", "int8-dynamic", "float8-dynamic"])
def test_on_gpu(scheme: str, tmp_path: Path) -> None:
    if TorchAO(scheme=scheme).unavailable_reason(CUDA):
        pytest.skip(str(TorchAO(scheme=scheme).unavailable_reason(CUDA)))
    _check(scheme, CUDA, tmp_path)
