"""The environment record's schema, checked before any entry of a record read from a file is used.

Every entry must be present with its type, lists and strings bounded, backend kinds of the closed
form :data:`~tunetree.runtime.artifacts.KIND`.
"""

from __future__ import annotations

from typing import Any

from ..runtime.artifacts import KIND

MAX_TEXT = 4096
"""Longest string entry accepted in a record."""
MAX_ITEMS = 4096
"""Longest list, or object of versions or accelerators, accepted in a record."""


def _text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 20


def _texts(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= MAX_ITEMS and all(map(_text, value))


def _object(value: Any, entries: dict[str, Any]) -> str | None:
    """The first problem of an object whose ``entries`` map names to checks."""
    if not isinstance(value, dict):
        return "is not an object"
    for name, check in entries.items():
        if name not in value:
            return f"{name!r} is missing"
        if not check(value[name]):
            return f"{name!r} has the wrong type or size"
    return None


def _accelerator(value: Any) -> bool:
    optional = {"names": _texts, "capabilities": _texts, "driver": _text, "runtime": _text}
    optional["cudnn"] = _text
    return (
        isinstance(value, dict)
        and _count(value.get("count"))
        and all(check(value[k]) for k, check in optional.items() if k in value)
    )


def record_problem(record: Any) -> str | None:
    """What is wrong with a parsed environment record, or None when it fits the schema."""
    top = {
        "host": _text,
        "os": lambda v: _object(v, {"system": _text, "release": _text, "machine": _text}) is None,
        "cpu": lambda v: (
            _object(v, {"model": _text, "flags": _texts, "logical_cores": _count}) is None
        ),
        "accelerators": lambda v: (
            isinstance(v, dict)
            and len(v) <= MAX_ITEMS
            and all(_text(k) and _accelerator(a) for k, a in v.items())
        ),
        "backends": lambda v: _texts(v) and all(KIND.fullmatch(k) for k in v),
        "versions": lambda v: (
            isinstance(v, dict)
            and len(v) <= MAX_ITEMS
            and all(_text(k) and _text(x) for k, x in v.items())
        ),
    }
    problem = _object(record, top)
    return f"the record {problem}" if problem else None
