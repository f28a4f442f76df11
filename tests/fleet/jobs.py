"""Importable build and data functions for fleet jobs (a worker imports them by name)."""

from __future__ import annotations

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
