"""matplotlib for the PNGs results draw, imported only when one is asked for."""

from __future__ import annotations

from typing import Any

from ..errors import MissingDependencyError


def pyplot(what: str) -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend; ``what`` names the caller in the error.

    Raises :class:`MissingDependencyError` naming the ``tunetree[plot]`` extra without it.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError(
            f"{what} needs matplotlib: pip install 'tunetree[plot]'"
        ) from exc
    return plt
