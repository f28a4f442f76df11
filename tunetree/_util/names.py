"""The name a class or function goes by in keys: never where in tunetree it is defined.

tunetree's own objects are named ``tunetree.<qualified name>``, whatever module holds them, so
moving code between files changes no cache key. Other packages' objects keep their module
path (a user's model class, a plugin backend): that is their identity.
"""

from __future__ import annotations

from typing import Any

PACKAGE = "tunetree"


def stable_name(obj: Any) -> str:
    """``module.qualname`` of ``obj``, with any module of tunetree read as ``tunetree``.

    Args:
        obj: A class or function (anything with ``__qualname__``; else its type is named).

    Returns:
        E.g. ``"tunetree.HighestThroughputStrategy"`` or ``"my_models.Encoder"``.
    """
    qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    module = getattr(obj, "__module__", None) or ""
    if module == PACKAGE or module.startswith(PACKAGE + "."):
        module = PACKAGE
    return f"{module}.{qualname}" if module else qualname
