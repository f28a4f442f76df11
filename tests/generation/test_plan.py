"""Where a tuning budget goes for ``generate`` (issue 28): the decode graph first, end-to-end
measurements on one representative prompt, and recording only as deep as the tune needs."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.generation.test_static_decode import PROMPTS, mistral, prompt, static
from tunetree.backends.base import Backend, Runner
from tunetree.generation import (
    by_time_share,
    end_to_end_config,
    end_to_end_samples,
    graph_step,
    is_generation,
)
from tunetree.signature.binding import Binder, original_forward
from tunetree.signature.graph import Graph

pytest.importorskip("transformers")


def test_generation_is_told_from_other_calls() -> None:
    model = mistral()
    assert is_generation(tt.inspect(model, PROMPTS, call=static(3), max_depth=0), model)
    plain = nn.Linear(4, 2).eval()
    assert not is_generation(tt.inspect(plain, [torch.randn(2, 4)]), plain)


def test_inspection_records_only_as_deep_as_asked() -> None:
    model = mistral()
    shallow = tt.inspect(model, PROMPTS, call=static(3), max_depth=0)
    assert [m.depth for m in shallow.modules.values()] == [0]
    deep = tt.inspect(model, PROMPTS, call=static(3), max_depth=1)
    assert {m.depth for m in deep.modules.values()} == {0, 1}


def test_the_end_to_end_measurement_times_the_median_prompt_with_few_trials() -> None:
    info = tt.inspect(mistral(), [prompt(1, 8, 1), prompt(2, 30, 2), prompt(2, 12, 3)],
                      call=static(2), max_depth=0)  # fmt: skip
    (sample,) = end_to_end_samples(info)
    assert tuple(sample.kwargs["input_ids"].shape) == (2, 12)
    config = end_to_end_config(tt.MeasureConfig())
    assert config.trials <= 5 and not config.rematch


def test_graphs_are_ordered_by_their_share_of_eager_time() -> None:
    def graph(total_s: float) -> Graph:
        return Graph(key=None, samples=[], outputs=[], total_s=total_s)  # type: ignore[arg-type]

    todo = [("", None, graph(0.1)), ("", None, graph(2.0)), ("", None, graph(0.0))]
    assert by_time_share(todo) == [1, 0, 2]


BUILT: list[str] = []


@dataclasses.dataclass(frozen=True)
class Records(Backend):
    """Eager, noting the step of each graph it is built for (the order graphs are tuned in)."""

    kind: ClassVar[str] = "fake-records-step"

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        BUILT.append(graph_step(graph, Binder.of_module(module).names) or "other")
        forward = original_forward(module)

        class _Run(Runner):
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return forward(*args, **kwargs)

        return _Run(self)


def test_the_decode_graph_is_tuned_first() -> None:
    BUILT.clear()
    result = tt.tune(
        mistral(),
        PROMPTS,
        call=static(6),
        strategy=tt.OneBackendStrategy(Records()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    assert BUILT[0] == "decode" and BUILT.count("decode") == 1, BUILT
    # Results keep the cut's order (the first prefill first).
    assert graph_step(result.graphs[0].graph) == "prefill"
