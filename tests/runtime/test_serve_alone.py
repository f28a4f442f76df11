"""Issue 31: a root runner serving generation steps is not told it serves alone.

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
from tunetree.runtime.wrap import unwrap, wrap
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


def test_only_a_root_runner_of_plain_calls_serves_alone() -> None:
    model = nn.Linear(2, 2)
    plain, step = Recording(), Recording()
    plain_key = GraphKey.of((torch.zeros(1, 2),), {})
    cache = transformers.DynamicCache()
    step_key = GraphKey.of((torch.zeros(1, 1),), {"past_key_values": cache})
    assert step_key.holds_cache and not plain_key.holds_cache
    wrap(model, {"": {plain_key: plain}})
    assert plain.alone
    wrap(model, {"": {step_key: step}})
    assert not step.alone
    unwrap(model)
