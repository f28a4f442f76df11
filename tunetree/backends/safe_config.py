"""Checks of backend configs read from a file (a checkpoint or a cache entry).

A config read from a file is untrusted: a value such as Inductor's ``cpp.cxx`` names a program
that compiling runs, ``trace.debug_dir`` a directory that compiling writes to. Before a saved
config builds a backend it passes :meth:`~tunetree.backends.base.Backend.check_saved_config`,
built from the helpers here: only the class's own fields, plain JSON scalars, short strings
of a closed alphabet, bounded numbers, and per-backend allow-lists where a field reaches a
library. The user may skip the check for files they wrote themselves
(``tt.load(..., trust_config=True)``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from ..errors import UntrustedConfigError

TOKEN = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
"""What a string value of a saved config may look like by default: no path separators,
spaces, commas or shell characters."""

MAX_INT = 1 << 20
"""Largest integer a saved config may hold by default (counts, sizes)."""

MAX_THREADS = 1024
"""Largest thread or stream count a saved config may ask a runtime for."""


def refuse(kind: str, field: str, what: str) -> UntrustedConfigError:
    """The error for a refused field of a ``kind`` config."""
    return UntrustedConfigError(
        f"the saved {kind} configuration's field {field!r} {what}: a configuration read from "
        "a file may not name programs, paths or code. If you wrote this file yourself, load "
        "it with trust_config=True"
    )


def check_fields(kind: str, cls: type, config: Mapping[str, Any]) -> None:
    """Refuse a config that is no object or holds a key that is not a field of ``cls``."""
    if not isinstance(config, Mapping):
        raise refuse(kind, "<config>", "is not an object")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in config:
        if key not in known:
            raise refuse(kind, str(key)[:80], "is not a field of this backend")


def check_scalar(kind: str, field: str, value: Any) -> None:
    """None, a bool, a bounded int, a finite float or a :data:`TOKEN` string."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise refuse(kind, field, f"is {value}, out of bounds (|x| <= {MAX_INT})")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise refuse(kind, field, "is not a finite number")
        return
    if isinstance(value, str):
        if not TOKEN.fullmatch(value):
            raise refuse(kind, field, f"is {value[:80]!r}, not a plain word")
        return
    raise refuse(kind, field, f"is a {type(value).__name__}, not a plain value")


def check_plain(kind: str, cls: type, config: Mapping[str, Any]) -> None:
    """The default check: known fields holding plain scalars only."""
    check_fields(kind, cls, config)
    for field, value in config.items():
        check_scalar(kind, field, value)


def check_choice(kind: str, field: str, value: Any, allowed: Collection[Any]) -> None:
    """``value`` must be one of ``allowed``."""
    plain = isinstance(value, bool | int | float | str) or value is None
    if plain and value in allowed and type(value) in {type(a) for a in allowed}:
        return
    raise refuse(kind, field, f"is {str(value)[:80]!r}, not one of {sorted(map(str, allowed))}")


def check_count(kind: str, field: str, value: Any, high: int = MAX_THREADS) -> None:
    """``value`` must be None or an int in ``0..high``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise refuse(kind, field, f"is {str(value)[:80]!r}, not a count in 0..{high}")


def check_pattern(kind: str, field: str, value: Any, pattern: re.Pattern[str]) -> None:
    """``value`` must be None or a string matching ``pattern`` in full."""
    if value is None:
        return
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise refuse(kind, field, f"is {str(value)[:80]!r}, not of the form {pattern.pattern}")
