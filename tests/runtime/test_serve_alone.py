"""Issues 30 and 31: no runner serves alone unless the user asks (``tt.serve_alone``), and
then only a root runner of plain calls, not one serving generation steps.

Between two decode steps the generate loop runs torch code (logits processors, the next
input); ONNX Runtime threads spinning there made Mixtral's tuned generate 0.90x eager against
1.37x with them idle (2-core EPYC, load 6-7, same run).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.fakes import Delayed
from tunetree.backends.base import Runner
from tunetree.runtime.wrap import serve_alone, unwrap, wrap
from tunetree.signature.graph import GraphKey

transformers = pytest.importorskip("transformers")


class Recording(Runner):
    def __init__(self) -> None:
        super().__init__(Delayed())
        self.alone = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def serve_alone(self) -> None:
        self.alone = True


def test_only_a_root_runner_of_plain_calls_serves_alone_when_asked() -> None:
    plain, step = Recording(), Recording()
    plain_key = GraphKey.of((torch.zeros(1, 2),), {})
    cache = transformers.DynamicCache()
    step_key = GraphKey.of((torch.zeros(1, 1),), {"past_key_values": cache})
    assert step_key.holds_cache and not plain_key.holds_cache
    model = wrap(nn.Linear(2, 2), {"": {plain_key: plain, step_key: step}})
    assert not plain.alone and not step.alone  # nobody spins by default
    assert serve_alone(model) == 1
    assert plain.alone and not step.alone
    unwrap(model)


def test_a_submodule_runner_is_never_told() -> None:
    inner = Recording()
    model = nn.Sequential(nn.Linear(2, 2))
    key = GraphKey.of((torch.zeros(1, 2),), {})
    wrap(model, {"0": {key: inner}})
    assert serve_alone(model) == 0
    assert not inner.alone
    unwrap(model)
