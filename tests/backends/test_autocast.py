"""Autocast: bf16 on CPU is close within its own tolerances and refused by the default ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tunetree.backends import Autocast, backend_type, default_backends
from tunetree.backends.registry import BUILTIN_BACKENDS
from tunetree.errors import InvalidInputError
from tunetree.signature.compare import Tolerances, compare_all
from tunetree.signature.graph import Sample

from .export_models import graph_of, run_all

CPU = torch.device("cpu")


class TwoHeads(nn.Module):
    """Returns a dict of a float output, an integer output and a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU())
        self.head = nn.Linear(256, 16)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        logits = self.head(self.body(x))
        return {"logits": logits, "label": logits.argmax(-1), "note": "ok"}


def test_config_and_registration() -> None:
    assert Autocast in BUILTIN_BACKENDS and backend_type("autocast") is Autocast
    assert not Autocast.preserves_results
    assert all(not isinstance(b, Autocast) for b in default_backends(CPU))
    assert Autocast(dtype="fp16").name == "autocast(dtype='fp16')"
    assert Autocast(atol=0.1).tolerances() == Tolerances.uniform(0.1, 5e-2)
    with pytest.raises(InvalidInputError, match="bf16"):
        Autocast(dtype="fp8")


def test_unavailable_reasons() -> None:
    assert Autocast().unavailable_reason(CPU) is None
    reason = Autocast(dtype="fp16").unavailable_reason(CPU)
    assert reason is not None and "CUDA only" in reason
    if not torch.cuda.is_available():
        reason = Autocast().unavailable_reason(torch.device("cuda"))
        assert reason is not None and "CUDA is not available" in reason


def test_bf16_on_cpu_close_but_not_equal(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = TwoHeads().eval()
    samples = [Sample((torch.randn(8, 64),)) for _ in range(2)]
    graph = graph_of(module, samples)
    backend = Autocast()
    runner = backend.build(module, graph, CPU)
    outputs = run_all(runner, graph)

    # Same structure and dtypes as eager (outputs are cast back to float32) ...
    assert outputs[0]["logits"].dtype == torch.float32 and outputs[0]["note"] == "ok"
    close = compare_all(
        [{"logits": o["logits"]} for o in graph.outputs],
        [{"logits": o["logits"]} for o in outputs],
        backend.tolerances(),
    )
    assert close.ok, close.reason
    # ... yet bf16 arithmetic differs measurably: the default tolerances refuse it.
    strict = compare_all(graph.outputs, outputs, Tolerances())
    assert not strict.ok and strict.max_abs_diff > 1e-4

    saved_record = runner.save(tmp_path)
    assert not any(tmp_path.iterdir())
    loaded = backend.load(module, graph.key, tmp_path, saved_record, CPU)
    again = run_all(loaded, graph)
    assert all(torch.equal(a["logits"], b["logits"]) for a, b in zip(outputs, again, strict=True))
