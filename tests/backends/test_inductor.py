"""Inductor backend: results equal to eager on the four reference models, save/load by
recompiling, its own dynamo cache per runner, and configuration checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tunetree.backends import Inductor
from tunetree.errors import InvalidInputError

from .export_models import CPU, check_conformance, graph_of, mlp, run_all


@pytest.mark.parametrize(
    "model",
    [
        "mlp",
        pytest.param("encoder", marks=pytest.mark.slow),
        pytest.param("cnn", marks=pytest.mark.slow),
        pytest.param("bert", marks=pytest.mark.slow),
    ],
)
def test_matches_eager_and_round_trips(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_conformance(Inductor(), model, tmp_path, monkeypatch)


def test_many_runners_each_compile() -> None:
    """More runners than dynamo's recompile limit (8) must all be compiled, none silently eager."""
    import torch._dynamo.utils as dynamo_utils

    dynamo_utils.counters.clear()
    for _ in range(10):
        module, samples = mlp()
        run_all(Inductor().build(module, graph_of(module, samples), CPU), graph_of(module, samples))
    assert dynamo_utils.counters["stats"]["unique_graphs"] >= 10


def test_mode_and_options_together_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="either mode or options"):
        Inductor(mode="max-autotune", options={"freezing": True})
    assert Inductor(options={"freezing": True}).options == (("freezing", True),)


def test_reduce_overhead_needs_cuda() -> None:
    assert Inductor(mode="reduce-overhead").unavailable_reason(torch.device("cpu"))
    assert Inductor().unavailable_reason(CPU) is None
