from __future__ import annotations

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import mlp
from tunetree.signature.graph import Sample
from tunetree.signature.modules import (
    find_module,
    module_paths,
    resolve_device,
    root_modules,
    run_model,
    synchronize,
)


class Pipeline:
    """A plain object holding modules, run by a call function."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.encode = nn.Linear(4, 8)
        self.decode = nn.Sequential(nn.ReLU(), nn.Linear(8, 2))
        self._hidden = nn.Linear(2, 2)  # private attributes are not part of the model


def test_root_modules_of_a_module_and_of_a_pipeline() -> None:
    model = mlp()
    assert root_modules(model) == {"": model}
    pipe = Pipeline()
    assert root_modules(pipe) == {"decode": pipe.decode, "encode": pipe.encode}
    with pytest.raises(tt.InvalidInputError, match=r"neither an nn\.Module"):
        root_modules(object())


def test_paths_and_find_module_agree() -> None:
    for model in (mlp(), Pipeline()):
        pairs = list(module_paths(model))
        assert pairs, "every model has at least one module"
        for path, module in pairs:
            assert find_module(model, path) is module
    assert [p for p, _ in module_paths(Pipeline())] == ["decode", "decode.0", "decode.1", "encode"]
    with pytest.raises(tt.InvalidInputError, match="no module at path"):
        find_module(Pipeline(), "missing.0")


def test_run_model_calls_the_module_or_the_call_function() -> None:
    model = mlp()
    x = torch.randn(2, 16)
    with torch.no_grad():
        assert torch.equal(run_model(model, Sample((x,)), None), model(x))
        pipe = Pipeline()
        y = torch.randn(3, 4)
        out = run_model(pipe, Sample((y,)), lambda p, v: p.decode(p.encode(v)))
        assert torch.equal(out, pipe.decode(pipe.encode(y)))
    with pytest.raises(tt.InvalidInputError, match="pass call="):
        run_model(Pipeline(), Sample((y,)), None)


def test_resolve_device_prefers_the_given_one_then_the_weights() -> None:
    assert resolve_device(mlp(), "meta") == torch.device("meta")
    assert resolve_device(mlp().to("meta"), None) == torch.device("meta")
    assert resolve_device(nn.ReLU(), None) == torch.device("cpu")  # no tensors at all
    synchronize(torch.device("cpu"))  # a no-op off accelerators: must not raise
