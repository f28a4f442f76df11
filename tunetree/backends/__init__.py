"""Candidate backends, each in its own module, found by kind through :mod:`.registry`.

Heavy packages are imported lazily, so every backend class can be imported and named even
where its package is missing. The registry finds built-ins and entry point plugins.
"""

from __future__ import annotations

import torch

from .._util.deprecation import Moved, moved_names
from .autocast import Autocast
from .base import Backend, ChangesResults, Runner
from .cpu_features import cpu_supports
from .device_graph import DeviceGraph
from .eager import Eager
from .inductor import Inductor
from .onnxruntime import OnnxRuntime
from .onnxruntime_int8 import OnnxRuntimeInt8
from .openvino import OpenVINO, OpenVINOBf16
from .registry import backend_type, registered_backends
from .tf32 import Tf32
from .torchao import TorchAO


def default_backends(device: torch.device) -> list[Backend]:
    """The result-preserving candidates tried by default on ``device``, in order.

    Backends that cannot run there are kept; the strategy drops them with one log line.

    Args:
        device: The device the model runs on.

    Returns:
        New backend objects.

    Example:
        >>> import torch, tunetree as tt
        >>> [b.kind for b in tt.backends.default_backends(torch.device("cpu"))]
        ['inductor', 'openvino', 'onnxruntime', 'eager']
    """
    if device.type == "cuda":
        # Inductor refuses decode steps (a cache object in the inputs): their compiled
        # candidate is Inductor's code captured in a device graph on the static cache.
        compiled_decode = DeviceGraph(compile=True, compile_mode=None, decode_only=True)
        return [
            Inductor(),
            Inductor(mode="reduce-overhead"),
            DeviceGraph(),
            compiled_decode,
            OnnxRuntime(),
            Eager(),
        ]
    if device.type == "xpu":
        return [Inductor(), DeviceGraph(), OpenVINO(), Eager()]
    return [Inductor(), OpenVINO(), OnnxRuntime(), Eager()]


def reduced_precision_backends(device: torch.device) -> list[Backend]:
    """The results-changing candidates an accuracy budget adds on ``device``, in order.

    Each is checked by its measured error, never assumed: on a CPU OpenVINO in bf16 and
    ``torch.autocast`` bf16 (where the CPU has bf16 units) and ONNX Runtime with int8 weights;
    on CUDA TF32 matmuls, bf16 and fp16 autocast, and bf16 autocast compiled by Inductor (also
    with CUDA graphs: at small batch a launch-bound model gains from bf16 only without
    launches).

    Args:
        device: The device the model runs on.

    Returns:
        New backend objects (none on other devices).

    Example:
        >>> import torch, tunetree as tt
        >>> all(not b.preserves_results
        ...     for b in tt.backends.reduced_precision_backends(torch.device("cpu")))
        True
    """
    if device.type == "cuda":
        return [
            Tf32(),
            Autocast("bf16"),
            Autocast("fp16"),
            Autocast("bf16", compile=True),
            Autocast("bf16", compile=True, compile_mode="reduce-overhead"),
        ]
    if device.type == "cpu":
        found: list[Backend] = [OpenVINOBf16()]
        if _cpu_has_bf16():
            found.append(Autocast("bf16"))
        return [*found, OnnxRuntimeInt8()]
    return []


def _cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX-512 bf16 or AMX): autocast pays there."""
    return cpu_supports("_is_avx512_bf16_supported", "_is_amx_tile_supported")


__all__ = [
    "Autocast",
    "Backend",
    "ChangesResults",
    "DeviceGraph",
    "Eager",
    "Inductor",
    "OnnxRuntime",
    "OnnxRuntimeInt8",
    "OpenVINO",
    "OpenVINOBf16",
    "Runner",
    "Tf32",
    "TorchAO",
    "backend_type",
    "default_backends",
    "reduced_precision_backends",
    "registered_backends",
]

_MOVED = {
    "BACKEND_TYPES": Moved(
        "tunetree.backends.registry",
        "BUILTIN_BACKENDS",
        use="`tunetree.backends.registered_backends()` (built-ins and plugins)",
    ),
    "libraries_of": Moved("tunetree.backends.registry"),
    "original_forward": Moved("tunetree.signature.binding"),
}
"""Names this package exported before its API was narrowed, and where they live now."""

__getattr__ = moved_names("tunetree.backends", _MOVED)
