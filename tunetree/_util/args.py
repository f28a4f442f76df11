"""Command-line options shared by ``tunetree demo`` and ``python -m tunetree.demo`` (no torch)."""

from __future__ import annotations

import argparse
from typing import Literal


def budget_argument(text: str) -> float | Literal["default"] | None:
    """``--time-budget``: seconds, ``none`` (unlimited) or ``default``."""
    lowered = text.strip().lower()
    if lowered in ("none", "default"):
        return None if lowered == "none" else "default"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seconds, 'none' or 'default', got {text!r}"
        ) from None


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--time-budget``, ``--quick`` and ``--accuracy`` options of the demo."""
    parser.add_argument(
        "--time-budget",
        type=budget_argument,
        default="default",
        help="seconds, or 'none' for unlimited (default: auto_tune's default budget)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a first look: quick backends, shorter measurements"
    )
    parser.add_argument(
        "--accuracy",
        type=float,
        default=1e-2,
        metavar="MAX_ERROR",
        help="also tune under an accuracy budget of this relative L2 error (results change; "
        "default 1e-2, 0 to skip)",
    )
