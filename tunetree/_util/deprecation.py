"""Names a package no longer exports, still importable for one release with a warning.

A package lists what moved in a constant mapping and hands it to :func:`moved_names`, whose
result becomes the package's module-level ``__getattr__`` (PEP 562): the first access of such
a name imports it from where it lives now and warns, naming the new import path.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Moved:
    """Where a name that a package no longer exports lives now.

    Attributes:
        module: The module to import it from, e.g. ``"tunetree.candidates.measure"``.
        name: Its name there (default: the same name).
        use: What the warning tells to use instead, when not ``from module import name``
            (a renamed class whose old name ``module`` still serves, say).
    """

    module: str
    name: str = ""
    use: str = ""


def moved_names(package: str, moved: Mapping[str, Moved]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``moved``'s names with a ``DeprecationWarning``.

    Args:
        package: The package's import name, as the warning shows it (``"tunetree"``).
        moved: Each old name and where it lives now.

    Returns:
        A function for the package's ``__getattr__``; it raises ``AttributeError`` for any
        other name, as a module does.
    """

    def __getattr__(name: str) -> Any:
        where = moved.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        new_name = where.name or name
        warnings.warn(
            f"{package}.{name} is no longer part of {package}'s public API and will be removed "
            f"in the next release; use {where.use or f'`from {where.module} import {new_name}`'}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(where.module), new_name)

    return __getattr__
