"""matplotlib for the PNGs results draw, imported only when one is asked for.

Charts are drawn on a :class:`matplotlib.figure.Figure` of their own and written with its
``savefig``: ``pyplot`` is never imported and the backend never switched, so a notebook's or
an application's plotting is left as it was.
"""

from __future__ import annotations

from typing import Any

from ..errors import MissingDependencyError


def figure(what: str, figsize: tuple[float, float]) -> Any:
    """A new ``matplotlib.figure.Figure`` of ``figsize`` inches, outside pyplot's figure list.

    Args:
        what: the caller, named in the error.
        figsize: width and height in inches.

    Returns:
        The figure; ``figure.savefig(path)`` writes it (matplotlib picks the Agg canvas for
        a PNG by itself).

    Raises:
        MissingDependencyError: matplotlib is not installed (names the ``tunetree[plot]`` extra).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError(
            f"{what} needs matplotlib: pip install 'tunetree[plot]'"
        ) from exc
    return Figure(figsize=figsize)
