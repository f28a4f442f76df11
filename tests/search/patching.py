"""Fakes put where ``auto_tune`` looks them up: its entry point and its per-depth work."""

from __future__ import annotations

from typing import Any

import pytest

import tunetree.search.auto
import tunetree.search.depths

MODULES = (tunetree.search.auto, tunetree.search.depths)
"""The modules that time models end to end (the untuned model; each depth and the final)."""


def patch_side_by_side(monkeypatch: pytest.MonkeyPatch, fake: Any) -> None:
    """Every end-to-end measurement of ``auto_tune`` goes through ``fake``."""
    for module in MODULES:
        monkeypatch.setattr(module, "side_by_side", fake)


def patch_now(monkeypatch: pytest.MonkeyPatch, fake: Any) -> None:
    """``auto_tune``'s own clock reads ``fake`` (the deadline's is ``candidates.budget.now``)."""
    for module in MODULES:
        monkeypatch.setattr(module, "now", fake)
