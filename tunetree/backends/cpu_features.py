"""What this CPU computes natively, read from torch's own CPU checks.

The checks (``torch.cpu._is_vnni_supported`` and the like) are private, so a torch without one
answers False rather than failing.
"""

from __future__ import annotations

import torch


def cpu_supports(*checks: str) -> bool:
    """Whether any of torch's CPU checks named ``checks`` (``"_is_vnni_supported"``) says yes."""
    cpu = getattr(torch, "cpu", None)
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)
