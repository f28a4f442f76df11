"""The kind of machine a job ran on: what must be equal for tuning results to carry over.

A hardware class names the device (CPU model, or the accelerator's name and capability) and
ends with a digest of the cache's hard environment fields that are not library versions
(device, CPU model and instruction-set flags, OS machine). Two nodes of one class share cache
entries; rows of different classes are never merged.
"""

from __future__ import annotations

import hashlib
import json

import torch

from ..cache import keys


def hardware_class(device: torch.device | str = "cpu") -> str:
    """``cpu: <model> [digest]`` or ``cuda: <name> sm<cap> [digest]`` for this process."""
    device = torch.device(device)
    hard = keys.environment(device, []).hard
    fields = {k: v for k, v in hard.items() if not k.startswith("versions.")}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]
    if device.type == "cpu":
        name = str(hard.get("cpu.model", "cpu"))
    else:
        name = str(hard.get("device_name", device.type))
        capability = hard.get("device_capability")
        if capability:
            name += " sm" + "".join(str(c) for c in capability)
    return f"{device.type}: {name} [{digest}]"
