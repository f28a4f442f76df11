"""Importable build and data functions for fleet jobs (a worker imports them by name)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..cache import fakes


def tree() -> torch.nn.Module:
    return fakes.tree(seed=0)


def wide_tree() -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights on every node (tolerances follow the outputs)
    return fakes.Tree(width=16).eval()


def data() -> list[torch.Tensor]:
    return [torch.randn(4, 8, generator=torch.Generator().manual_seed(1))]


def wide_data() -> list[torch.Tensor]:
    return [torch.randn(4, 16, generator=torch.Generator().manual_seed(1))]


def broken() -> torch.nn.Module:
    raise RuntimeError("this model cannot be built here")


def options() -> dict[str, Any]:
    import tunetree as tt

    return {
        "strategy": fakes.strategy("first-wins"),
        "measure_config": tt.MeasureConfig.quick(),
        "time_budget": 120,
    }


def mlp() -> torch.nn.Module:
    """A 3-layer 256-wide Linear+GELU MLP, the same weights on every node."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(3):
        layers += [torch.nn.Linear(256, 256), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).eval()


def mlp_data() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(8, 256, generator=generator) for _ in range(3)]


HANGS_PID = Path(tempfile.gettempdir()) / "tunetree-test-fleet-hangs.pid"
"""Where :func:`hangs` writes its worker's process id."""


def hangs() -> torch.nn.Module:
    """A build that never returns (after writing its process id to :data:`HANGS_PID`)."""
    HANGS_PID.write_text(str(os.getpid()))
    while True:
        time.sleep(60)
