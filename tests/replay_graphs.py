"""A stand-in for CUDA graphs on the CPU that replays what was captured, not the Python.

``torch.cuda.CUDAGraph`` records the kernels one call launched and replays them on the same
memory: Python does not run again, so an int the forward read during the capture (a sliding
window's position) stays what it was then. :class:`OpGraph` records every aten op of the
captured call (with a dispatch mode) and its replay runs those ops again on the same tensors,
writing each result into the tensor the capture produced; ops that need the host to read a
tensor (``.item()``) fail the capture, as they do on a GPU. The fixture :func:`op_graphs`
installs it as the device graph API, so the runner's own plumbing runs unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from tunetree.backends import device_graph
from tunetree.backends.graph_api import GraphApi

_HOST_READS = {"_local_scalar_dense", "is_nonzero", "item"}


class _Recorder(TorchDispatchMode):
    def __init__(self, ops: list[tuple[Any, tuple, dict, Any]]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        if func.overloadpacket.__name__ in _HOST_READS:
            raise RuntimeError(f"operation not permitted when stream is capturing ({func})")
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class OpGraph:
    """Records the aten ops of a capture; :meth:`replay` runs them again on the same tensors."""

    replays = 0
    """Replays by every graph (a test reads how many calls were served by replays)."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def replay(self) -> None:
        OpGraph.replays += 1
        with torch.no_grad():
            for func, args, kwargs, out in self.ops:
                fresh = func(*args, **kwargs)
                for old, new in zip(
                    pytree.tree_leaves(out), pytree.tree_leaves(fresh), strict=True
                ):
                    if isinstance(old, torch.Tensor) and old is not new:
                        old.copy_(new)


class _Stream:
    def wait_stream(self, other: Any) -> None:
        pass


@contextmanager
def _capture(graph: OpGraph) -> Iterator[None]:
    with _Recorder(graph.ops):
        yield


@pytest.fixture
def op_graphs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Device graphs on the CPU, replayed op by op (see the module's docstring)."""
    api = GraphApi(
        graph=OpGraph,
        capture=_capture,
        stream=_Stream,
        use_stream=lambda stream: nullcontext(),
        current_stream=_Stream,
        device_guard=lambda device: nullcontext(),
    )
    monkeypatch.setattr(device_graph, "graph_api", lambda device: api)
    monkeypatch.setattr(device_graph.DeviceGraph, "unavailable_reason", lambda self, dev: None)
    OpGraph.replays = 0
    yield
