"""A ranged graph whose sizes torch cannot bound exports once more with unnamed dynamic axes.

SpeechT5's decoder steps guard on ``min(16 + 16*d, 64 + 64*d) == 16 + 16*d`` over the
cache's length: true for every length, unprovable for torch's symbolic reasoning, so
``torch.export`` with the graph's named ranges refused, tracing then met a tensor turned into
a Python boolean, and OpenVINO had no candidate for those steps.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tunetree.backends import OpenVINO
from tunetree.backends.ranged_export import export_ranged, relaxed_dynamic_shapes
from tunetree.backends.ranges import export_dynamic_shapes
from tunetree.signature.graph import Sample

from .test_ranges import CPU, check_serves_the_range, ranged_graph


class UnprovableGuard(nn.Module):
    """SpeechT5's guard, then a tensor's size read as a Python value (what tracing refuses)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[2]
        if min(16 + 16 * n, 64 + 64 * n) == 16 + 16 * n and x.numel() != 0:
            return x * 2 + 1
        return x * 3


class Specialising(nn.Module):
    """A branch on one length: any export keeping the example's branch serves that length only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1 if x.shape[2] == 4 else x


class Flat(nn.Module):
    """``forward(*tensors)``, the form a graph is exported in (:mod:`tunetree.backends.flat`)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.inner(*tensors)


def graph_of(module: nn.Module, lengths: tuple[int, ...]):
    return ranged_graph(module, [Sample((torch.randn(2, 3, n),)) for n in lengths])


def test_named_ranges_are_refused_by_torch_export_on_this_guard() -> None:
    """The premise: without the retry, torch.export raises (a test that fails if torch learns
    to prove it, so the retry can be dropped)."""
    module, graph = Flat(UnprovableGuard()), graph_of(UnprovableGuard(), (2, 3, 5))
    example = graph.samples[-1].args
    with pytest.raises(Exception, match="Constraints violated"):
        torch.export.export(module, example, dynamic_shapes=export_dynamic_shapes(graph.key))


def test_the_retry_keeps_the_range_with_unnamed_axes() -> None:
    module = Flat(UnprovableGuard())
    graph = graph_of(module, (2, 3, 5))
    exported = export_ranged(module, graph.samples[-1].args, graph.key)
    for n in (2, 4, 5):
        x = torch.randn(2, 3, n)
        assert torch.equal(exported.module()(x), module(x))
    assert relaxed_dynamic_shapes(graph.key) == (({2: torch.export.Dim.DYNAMIC},),)


def test_code_that_fixes_a_ranged_axis_is_still_refused() -> None:
    module = Flat(Specialising())
    graph = graph_of(module, (2, 4, 5))
    example = torch.randn(2, 3, 4)
    with pytest.raises(Exception, match="specialized it to be a constant"):
        export_ranged(module, (example,), graph.key)


def test_openvino_serves_a_range_torch_cannot_bound() -> None:
    """Failed before: ``ValueDependentError: ... tracing converted a tensor to a Python
    boolean`` (the named export refused, the tracing fallback met ``x.numel() != 0``)."""
    backend = OpenVINO()
    if backend.unavailable_reason(CPU) is not None:
        pytest.skip(str(backend.unavailable_reason(CPU)))
    module = UnprovableGuard()
    graph = graph_of(module, (2, 3, 5))
    runner = backend.build(module, graph, CPU)
    check_serves_the_range(runner, module, graph)
