"""The per-device-type calls a device graph's capture needs (CUDA and XPU differ in name)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import BackendError


@dataclasses.dataclass(frozen=True)
class GraphApi:
    """The handful of per-device-type calls that capture needs (CUDA and XPU differ in name)."""

    graph: Callable[[], Any]
    capture: Callable[..., Any]
    stream: Callable[..., Any]
    use_stream: Callable[[Any], Any]
    current_stream: Callable[..., Any]
    device_guard: Callable[[Any], Any]
    pool_handle: Callable[[], Any] | None = None
    """A new memory pool that several captures can share (None: each capture keeps its own)."""
    clear_workspaces: Callable[[], None] | None = None
    """Drop the BLAS library's per-stream workspaces (None: nothing to drop; see
    :func:`own_workspaces`)."""


@contextlib.contextmanager
def own_workspaces(api: GraphApi) -> Iterator[None]:
    """Warm up and capture with BLAS workspaces of their own, dropped again afterwards.

    cuBLAS keeps a workspace per stream it ran on, allocated on first use and held for the life
    of the process. Every capture's warm-up runs on a side stream of its own, so each would keep
    one (a block per capture, alive at tuning's peak), and the capture's own would go to the
    first capture's pool, where later captures on
    the same stream reused it, so freeing that pool could leave the others' workspace in freed
    memory. Dropped before, a capture allocates its workspace in its own pool, which lives as
    long as the graph; dropped after, nothing outside that pool holds it. Inductor's CUDA graph
    trees do the same. The cost: the next eager matmul allocates its workspace again. Between
    the warm-ups and the capture the runner drops them once more (:func:`drop_workspaces`).
    """
    drop_workspaces(api)
    try:
        yield
    finally:
        drop_workspaces(api)


def drop_workspaces(api: GraphApi) -> None:
    """Drop the BLAS library's per-stream workspaces, where the device has any to drop."""
    if api.clear_workspaces is not None:
        api.clear_workspaces()


def graph_api(device: torch.device) -> GraphApi:
    """The capture calls of ``device``'s type; BackendError on a device with no graphs."""
    if device.type == "cuda":
        return GraphApi(
            torch.cuda.CUDAGraph,
            torch.cuda.graph,
            torch.cuda.Stream,
            torch.cuda.stream,
            torch.cuda.current_stream,
            torch.cuda.device,
            getattr(torch.cuda, "graph_pool_handle", None),
            getattr(torch._C, "_cuda_clearCublasWorkspaces", None),
        )
    if device.type == "xpu" and hasattr(torch, "xpu") and hasattr(torch.xpu, "XPUGraph"):
        return GraphApi(
            torch.xpu.XPUGraph,
            torch.xpu.graph,
            torch.xpu.Stream,
            torch.xpu.stream,
            torch.xpu.current_stream,
            torch.xpu.device,
            getattr(torch.xpu, "graph_pool_handle", None),
        )
    raise BackendError(f"device graphs need a CUDA or XPU device, not {device}")
