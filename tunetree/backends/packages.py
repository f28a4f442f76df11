"""Optional packages of backends: which are missing here, and how to install them.

This is the one way tunetree tells the user how to install them: the backend's pip extra,
else its libraries.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def missing_packages(*names: str) -> list[str]:
    """Which of the top-level packages ``names`` cannot be imported here.

    Checked without importing them.
    """
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def install_hint(backend: Any, upgrade: bool = False) -> str:
    """The pip command that installs (or with ``upgrade`` upgrades) what ``backend`` needs.

    ``backend`` is a backend class or object; the command is ``pip install 'tunetree[extra]'``
    from its ``extra``, else names its ``libraries``.
    """
    command = "pip install -U" if upgrade else "pip install"
    extra = getattr(backend, "extra", None)
    if extra:
        return f"{command} 'tunetree[{extra}]'"
    libraries = tuple(getattr(backend, "libraries", ()))
    return f"{command} {' '.join(libraries) if libraries else 'tunetree'}"


def not_installed_reason(backend: Any, *packages: str) -> str | None:
    """Why ``backend`` cannot run when some of ``packages`` are missing; None when all import.

    ``packages`` are import names; the reason includes the install command.
    """
    missing = missing_packages(*packages)
    if not missing:
        return None
    verb = "is" if len(missing) == 1 else "are"
    return f"{', '.join(missing)} {verb} not installed: {install_hint(backend)}"
