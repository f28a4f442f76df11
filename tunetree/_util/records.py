"""Typed reading of JSON records: one place that refuses a malformed field, naming it.

Manifests of checkpoints and cache entries are read with a :class:`Fields` view of each
JSON object; a missing or mistyped field raises the error class the caller chose (a
:class:`~tunetree.errors.CheckpointError` or :class:`~tunetree.errors.CacheError`
subclass) with the field's dotted name, e.g. ``entries[0].backend.kind``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_MISSING = object()


class Fields:
    """A JSON object read field by field; ``where`` is its dotted name in the record."""

    def __init__(self, data: Any, where: str, error: type[Exception]) -> None:
        if not isinstance(data, dict):
            raise error(f"{where or 'the record'} is not an object (a {type(data).__name__})")
        self.data = data
        self.where = where
        self.error = error

    def name(self, field: str) -> str:
        """The dotted name of ``field`` inside this object."""
        return f"{self.where}.{field}" if self.where else field

    def fail(self, field: str, what: str) -> Exception:
        """The error for a bad ``field`` (returned, for the caller to raise)."""
        return self.error(f"field {self.name(field)!r} {what}")

    def get(self, field: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        """The value of ``field``, which must be a ``kind`` (bool is never an int here).

        Absent: ``default`` when given, else an error.
        """
        value = self.data.get(field, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise self.fail(field, "is missing")
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            raise self.fail(field, f"is a bool, not {_names(kinds)}")
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > 1 << 1000:
                raise self.fail(field, "is an integer too large for a number")
            return float(value)
        if not isinstance(value, kinds):
            raise self.fail(field, f"is a {type(value).__name__}, not {_names(kinds)}")
        return value

    def optional(self, field: str, kind: type | tuple[type, ...]) -> Any:
        """``field`` as a ``kind``, or None when it is absent or null."""
        if self.data.get(field) is None:
            return None
        return self.get(field, kind)

    def child(self, field: str) -> Fields:
        """The object under ``field``."""
        return Fields(self.get(field, dict), self.name(field), self.error)

    def items(self, field: str, read: Callable[[Fields], T]) -> list[T]:
        """Each object of the list under ``field``, read with ``read``."""
        return [
            read(Fields(item, f"{self.name(field)}[{i}]", self.error))
            for i, item in enumerate(self.get(field, list))
        ]


def _names(kinds: tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kinds)
