"""Export backends on a static cache whose capacity varies (issue 28, the CPU half).

``generate`` sizes each static cache by its prompt, so prefill and decode graphs are ranged over
the capacity. A cache layer rebuilt inside the exported function repeats that capacity as an
int (``max_cache_len``); read as a Python number while tracing, it fixed the export to the
example's size and ONNX Runtime and OpenVINO were refused on every generation graph.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tunetree as tt
from tests.generation.test_static_decode import mistral, prompt, static
from tunetree.generation import graph_step
from tunetree.hf.positions import mirrored_sizes
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.binding import Binder

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")


def test_a_mirrored_size_stays_symbolic_while_tracing() -> None:
    """Eagerly the size is an int; under ``torch.export`` it is the tensor's symbolic size."""
    keys = torch.zeros(1, 2, 9, 4)
    assert dict(mirrored_sizes(("max_cache_len",), {"keys": keys})) == {"max_cache_len": 9}

    class Capacity(torch.nn.Module):
        def forward(self, keys: torch.Tensor) -> torch.Tensor:
            ((_, size),) = mirrored_sizes(("max_cache_len",), {"keys": keys})
            return torch.arange(size)

    dim = torch.export.Dim("capacity", min=4, max=64)
    exported = torch.export.export(Capacity(), (keys,), dynamic_shapes=({2: dim},))
    assert exported.module()(torch.zeros(1, 2, 17, 4)).shape == (17,)


def test_onnx_runtime_serves_prefill_and_decode_across_capacities() -> None:
    model = mistral(sliding_window=None)
    call = static(5)
    unseen = [prompt(1, 11, 7), prompt(1, 13, 8)]
    expected = [call(model, **p) for p in unseen]
    result = tt.tune(
        model,
        [prompt(1, 8, 1), prompt(1, 16, 3)],
        call=call,
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    names = Binder.of_module(model).names
    steps: dict[str, Any] = {graph_step(g.graph, names): g for g in result.graphs}
    assert steps.keys() == {"prefill", "decode"}, result.table()
    for step in steps.values():
        ranged = {d.name for d in step.graph.key.dims().values() if d.min < d.max}
        assert "dim" in ranged, str(step.graph.key)  # ranged over the cache's capacity
        assert step.winner is not None and step.winner.backend.kind == "onnxruntime", result.table()
    dispatcher = dispatcher_of(result.model)
    assert dispatcher is not None
    assert {r.backend.kind for r in dispatcher.runners.values()} == {"onnxruntime"}
    fallbacks = dispatcher.fallback_calls
    for p, want in zip(unseen, expected, strict=True):
        assert torch.equal(call(result.model, **p), want)
    assert dispatcher.fallback_calls == fallbacks  # unseen capacities served by the runners
