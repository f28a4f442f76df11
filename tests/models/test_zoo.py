"""The zoo of awkward models (issue 11): each is tuned at depths 0-2 with Eager and ONNX
Runtime, and must match eager, leave the model's state untouched and survive save/load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import tunetree as tt
from tunetree.signature.compare import compare_all
from tunetree.signature.graph import as_samples
from tunetree.signature.modules import module_paths, run_model
from tunetree.signature.state import eval_mode

from .zoo import ZOO, Case, state_digest

pytest.importorskip("onnxruntime")


def outputs(case: Case, model: Any) -> list[Any]:
    """Eager outputs in eval mode (a training-mode model's flags are put back)."""
    with torch.no_grad(), eval_mode(model):
        return [run_model(model, s, case.call) for s in as_samples(case.data)]


def tune(case: Case, depth: int, *backends: tt.backends.Backend, **kw: Any) -> tt.TuneResult:
    kw.setdefault("allow_training", case.train)
    return tt.tune(
        case.model,
        case.data,
        depth=depth,
        call=case.call,
        strategy=tt.HighestThroughputStrategy(
            list(backends) or [tt.backends.Eager(), tt.backends.OnnxRuntime()]
        ),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
        **kw,
    )


def perturb(model: Any) -> None:
    with torch.no_grad():
        for _, module in module_paths(model):
            for p in module.parameters(recurse=False):
                p.add_(1.0)


@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_tunes_matches_keeps_state_and_round_trips(
    name: str, depth: int, tmp_path: Path
) -> None:
    case = ZOO[name]()
    expected = outputs(case, case.model)
    before = state_digest(case.model)
    if case.train:
        with pytest.raises(tt.InvalidInputError, match=r"training mode .*model\.eval\(\)"):
            tune(case, depth, tt.backends.Eager(), allow_training=False)
    result = tune(case, depth)
    assert state_digest(case.model) == before, "tuning changed the model's state"
    check = compare_all(expected, outputs(case, result.model), tt.Tolerances())
    assert check.ok, check.reason
    if depth == 0:  # the object passed in stays untuned: a second tune works
        assert tt.unwrap(case.model) == []
        tune(case, depth, tt.backends.Eager())
    path = tt.save(result, tmp_path / "model.tt")
    fresh = ZOO[name]().model
    perturb(fresh)  # the checkpoint's weights, not the fresh model's, must be used
    loaded = tt.load(fresh, path)
    check = compare_all(expected, outputs(case, loaded), tt.Tolerances())
    assert check.ok, check.reason
    result.undo()
    assert state_digest(case.model) == before, "undo changed the model's state"
