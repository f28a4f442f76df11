"""Candidate backends. Each lives in its own module; heavy packages are imported lazily,
so every backend class can be imported and named even where its package is missing."""

from __future__ import annotations

import torch

from .autocast import Autocast
from .base import Backend, ChangesResults, Runner, original_forward
from .device_graph import DeviceGraph
from .eager import Eager
from .inductor import Inductor
from .onnxruntime import OnnxRuntime
from .openvino import OpenVINO, OpenVINOBf16
from .torchao import TorchAO

BACKEND_TYPES: tuple[type[Backend], ...] = (
    Eager,
    Inductor,
    DeviceGraph,
    Autocast,
    TorchAO,
    OpenVINO,
    OpenVINOBf16,
    OnnxRuntime,
)
"""Every backend class tunetree knows, used to rebuild a backend from a checkpoint."""


def backend_type(kind: str) -> type[Backend]:
    """The backend class whose ``kind`` is ``kind``."""
    for cls in BACKEND_TYPES:
        if cls.kind == kind:
            return cls
    from ..errors import BackendUnavailableError

    known = ", ".join(cls.kind for cls in BACKEND_TYPES)
    raise BackendUnavailableError(f"unknown backend {kind!r}; this tunetree knows: {known}")


def default_backends(device: torch.device) -> list[Backend]:
    """The result-preserving candidates tried by default on ``device``, in order.
    Backends that cannot run there are kept; the strategy drops them with one log line."""
    if device.type == "cuda":
        return [Inductor(), Inductor(mode="reduce-overhead"), DeviceGraph(), OnnxRuntime(), Eager()]
    if device.type == "xpu":
        return [Inductor(), DeviceGraph(), OpenVINO(), Eager()]
    return [Inductor(), OpenVINO(), OnnxRuntime(), Eager()]


__all__ = [
    "BACKEND_TYPES",
    "Autocast",
    "Backend",
    "ChangesResults",
    "DeviceGraph",
    "Eager",
    "Inductor",
    "OnnxRuntime",
    "OpenVINO",
    "OpenVINOBf16",
    "Runner",
    "TorchAO",
    "backend_type",
    "default_backends",
    "original_forward",
]
