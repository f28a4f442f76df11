"""Where a model's tensors live, so that what a backend moved while building is put back.

A backend may move or cast a module's parameters while it builds (an export on another
device, a dtype change); tuning must leave the user's model as it was.
"""

from __future__ import annotations

from typing import Any

import torch

from ..signature.modules import module_paths

Placement = dict[tuple[int, str], tuple[torch.nn.Module, torch.device, torch.dtype]]


def tensor_devices(model: Any) -> Placement:
    """Device and dtype of every parameter and buffer, to put back what a backend moved."""
    found: Placement = {}
    for _, module in module_paths(model):
        for name, tensor in list(module.named_parameters(recurse=False)) + list(
            module.named_buffers(recurse=False)
        ):
            if tensor is not None:
                found[(id(module), name)] = (module, tensor.device, tensor.dtype)
    return found


def restore_devices(saved: Placement) -> None:
    """Put every parameter and buffer back on the device and dtype :func:`tensor_devices` saw."""
    for (_, name), (module, device, dtype) in saved.items():
        tensor = getattr(module, name, None)
        if isinstance(tensor, torch.Tensor) and (tensor.device, tensor.dtype) != (device, dtype):
            tensor.data = tensor.data.to(device=device, dtype=dtype)
