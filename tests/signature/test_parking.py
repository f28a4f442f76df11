"""Eager's outputs and probes wait in host memory while tuning on an accelerator (issue 28)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tunetree.signature.graph import Graph, Sample, flatten
from tunetree.signature.parking import park, park_outputs, reference, unpark
from tunetree.signature.shapes import group_graphs

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_a_host_tree_is_not_parked_and_not_copied() -> None:
    tree = {"a": torch.randn(2), "b": (torch.randn(3), 4)}
    parked, homes = park(tree)
    assert homes is None and parked is tree
    assert unpark(parked, None) is tree


def test_a_host_graphs_outputs_stay_as_recorded() -> None:
    module = nn.Linear(4, 3).eval()
    samples = [Sample((torch.randn(2, 4),)) for _ in range(2)]
    with torch.no_grad():
        outputs = [module(*s.args) for s in samples]
    graph = Graph(samples[0].key, samples, list(outputs))
    park_outputs(graph)
    assert graph.output_homes is None
    assert all(reference(graph, i) is outputs[i] for i in range(2))


def test_unpark_refuses_a_tree_whose_leaves_changed() -> None:
    with pytest.raises(ValueError, match="2 leaves now has 1"):
        unpark([torch.zeros(1)], (None, None))


@pytest.mark.gpu
@CUDA
def test_a_mixed_tree_goes_back_leaf_by_leaf() -> None:
    # A cache may keep a counter in host memory beside its tensors on the device: each leaf
    # goes back where it was, not all to one device.
    tree = (torch.randn(2, device="cuda"), torch.tensor(3), {"k": torch.ones(2, device="cuda")})
    parked, homes = park(tree)
    assert homes is not None
    leaves, _ = flatten(parked)
    assert all(leaf.device.type == "cpu" for leaf in leaves)
    back = unpark(parked, homes)
    assert back[0].is_cuda and not back[1].is_cuda and back[2]["k"].is_cuda
    assert torch.equal(back[0], tree[0]) and torch.equal(back[2]["k"], tree[2]["k"])


@pytest.mark.gpu
@CUDA
def test_recorded_graphs_on_the_device_keep_eagers_outputs_in_host_memory() -> None:
    module = nn.Linear(4, 3).cuda().eval()
    samples = [Sample((torch.randn(2, 4, device="cuda"),)) for _ in range(2)]
    with torch.no_grad():
        outputs = [module(*s.args) for s in samples]
    (graph,) = group_graphs(list(zip(samples, outputs, strict=True))).values()
    assert all(not o.is_cuda for o in graph.outputs)  # dtypes and shapes as eager's
    assert graph.outputs[0].dtype == outputs[0].dtype and graph.outputs[0].shape == (2, 3)
    for i, want in enumerate(outputs):
        got = reference(graph, i)
        assert got.is_cuda and torch.equal(got, want)
