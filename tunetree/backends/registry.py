"""Which backend classes exist, by ``kind``: built-ins, plugins and other defined subclasses.

The plugins are those of third-party packages advertised through the
``tunetree.backends`` entry point group; other subclasses of
:class:`~tunetree.backends.base.Backend` are any defined in this process (tests' fakes, a
user's own).

There is no registry dict: a backend registers by declaring its ``kind`` (checked unique by
``Backend.__init_subclass__``), and lookups walk the class hierarchy. Entry points are loaded
only when a lookup needs them; one that fails to load is logged and skipped. A kind read
from a file is only ever matched against these classes: no module is imported by a name that
a checkpoint or cache entry holds.
"""

from __future__ import annotations

import importlib.metadata
import logging

from ..errors import BackendUnavailableError
from .autocast import Autocast
from .base import Backend, backend_classes
from .device_graph import DeviceGraph
from .eager import Eager
from .inductor import Inductor
from .onnxruntime import OnnxRuntime
from .onnxruntime_int8 import OnnxRuntimeInt8
from .openvino import OpenVINO, OpenVINOBf16
from .tf32 import Tf32
from .torchao import TorchAO

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tunetree.backends"
"""Entry point group through which a package adds backends: each entry point names a
:class:`Backend` subclass (``"my_package.backend:MyBackend"``), which is imported on first
use."""

BUILTIN_BACKENDS: tuple[type[Backend], ...] = (
    Eager,
    Inductor,
    DeviceGraph,
    Autocast,
    TorchAO,
    OpenVINO,
    OpenVINOBf16,
    OnnxRuntime,
    Tf32,
    OnnxRuntimeInt8,
)
"""The backend classes that ship with tunetree."""


def load_plugins() -> list[type[Backend]]:
    """Import the backends advertised in the ``tunetree.backends`` entry point group.

    Returns those that loaded. A failing entry point, or one that names something other than a
    :class:`Backend` subclass, is logged and skipped: a broken plugin never breaks tunetree.
    """
    loaded: list[type[Backend]] = []
    try:
        entry_points = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:  # broken distribution metadata
        log.warning("could not list %s entry points: %r", ENTRY_POINT_GROUP, exc)
        return loaded
    for entry_point in entry_points:
        try:
            obj = entry_point.load()
        except Exception as exc:
            log.warning(
                "backend plugin %r (%s) failed to load and is skipped: %r",
                entry_point.name,
                entry_point.value,
                exc,
            )
            continue
        if not (isinstance(obj, type) and issubclass(obj, Backend)):
            log.warning(
                "backend plugin %r (%s) is not a tunetree Backend subclass; skipped",
                entry_point.name,
                entry_point.value,
            )
            continue
        loaded.append(obj)
    return loaded


def registered_backends() -> tuple[type[Backend], ...]:
    """Every backend class reachable by kind, one per kind.

    Returns:
        The built-ins first, then the plugins' and any other defined in this process.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.Eager in tt.backends.registered_backends()
        True
    """
    load_plugins()
    return tuple(_by_kind().values())


def backend_type(kind: str) -> type[Backend]:
    """The backend class whose ``kind`` is ``kind``.

    Plugins (``tunetree.backends`` entry points) are loaded when no class already defined has
    it.

    Args:
        kind: A backend kind, e.g. ``"openvino"``.

    Returns:
        The class.

    Raises:
        BackendUnavailableError: No class has that kind; the message names the known kinds.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.backend_type("openvino") is tt.backends.OpenVINO
        True
    """
    found = _by_kind().get(kind)
    if found is None:
        load_plugins()
        found = _by_kind().get(kind)
    if found is None:
        known = ", ".join(_by_kind())
        raise BackendUnavailableError(f"unknown backend {kind!r}; this tunetree knows: {known}")
    return found


def libraries_of(kind: str) -> tuple[str, ...]:
    """The pip distributions whose versions belong in the environment record for ``kind``."""
    return tuple(backend_type(kind).libraries)


def _by_kind() -> dict[str, type[Backend]]:
    """Kind -> class for the classes defined now, built-ins first.

    Of two classes with the same module and name (a module defined again), the later one wins.
    """
    classes: dict[str, type[Backend]] = {cls.kind: cls for cls in BUILTIN_BACKENDS}
    for cls in backend_classes():
        if classes.get(cls.kind) not in BUILTIN_BACKENDS:
            classes[cls.kind] = cls
    return classes
