"""The environment record's schema, checked before any entry of a record read from a file is used.

Every entry must be present with its type, lists and strings bounded, backend kinds of the closed
form :data:`~tunetree.runtime.artifacts.KIND`. Read with the same typed field reader as the
manifests (:class:`~tunetree._util.records.Fields`), so a problem names its dotted field.
"""

from __future__ import annotations

from typing import Any

from .._util.records import Fields
from ..runtime.artifacts import KIND

MAX_TEXT = 4096
"""Longest string entry accepted in a record."""
MAX_ITEMS = 4096
"""Longest list, or object of versions or accelerators, accepted in a record."""
MAX_COUNT = 1 << 20
"""Largest count (cores, devices) accepted in a record."""
_ACCELERATOR_TEXTS = ("driver", "runtime", "cudnn")
_ACCELERATOR_LISTS = ("names", "capabilities")


class _Malformed(Exception):
    """A field of the record that does not fit the schema."""


def record_problem(record: Any) -> str | None:
    """What is wrong with a parsed environment record, or None when it fits the schema.

    Args:
        record: The JSON value read from a file.

    Returns:
        The first problem, naming its field (e.g. ``field 'cpu.flags' is missing``), or None.
    """
    try:
        _check(Fields(record, "", _Malformed))
    except _Malformed as exc:
        return str(exc)
    return None


def _check(record: Fields) -> None:
    _text(record, "host")
    system = record.child("os")
    for name in ("system", "release", "machine"):
        _text(system, name)
    cpu = record.child("cpu")
    _text(cpu, "model")
    _texts(cpu, "flags")
    _count(cpu, "logical_cores")
    accelerators = _bounded_object(record, "accelerators")
    for name in accelerators.data:
        _key(accelerators, name)
        _accelerator(accelerators.child(name))
    for kind in _texts(record, "backends"):
        if not KIND.fullmatch(kind):
            raise record.fail("backends", f"holds {kind[:40]!r}, not a backend kind")
    versions = _bounded_object(record, "versions")
    for name in versions.data:
        _key(versions, name)
        _text(versions, name)


def _accelerator(device: Fields) -> None:
    _count(device, "count")
    for name in _ACCELERATOR_TEXTS:
        if name in device.data:
            _text(device, name)
    for name in _ACCELERATOR_LISTS:
        if name in device.data:
            _texts(device, name)


def _text(fields: Fields, name: str) -> str:
    value: str = fields.get(name, str)
    if len(value) > MAX_TEXT:
        raise fields.fail(name, f"is longer than {MAX_TEXT} characters")
    return value


def _key(fields: Fields, name: str) -> None:
    if len(name) > MAX_TEXT:
        raise fields.fail(name[:40], f"is named by more than {MAX_TEXT} characters")


def _count(fields: Fields, name: str) -> int:
    value: int = fields.get(name, int)
    if not 0 <= value <= MAX_COUNT:
        raise fields.fail(name, f"is {value}, not a count in 0..{MAX_COUNT}")
    return value


def _texts(fields: Fields, name: str) -> list[str]:
    value: list[Any] = fields.get(name, list)
    if len(value) > MAX_ITEMS:
        raise fields.fail(name, f"holds more than {MAX_ITEMS} items")
    for item in value:
        if not isinstance(item, str) or len(item) > MAX_TEXT:
            raise fields.fail(name, f"holds a {type(item).__name__}, not a string of a known size")
    return value


def _bounded_object(fields: Fields, name: str) -> Fields:
    child = fields.child(name)
    if len(child.data) > MAX_ITEMS:
        raise fields.fail(name, f"holds more than {MAX_ITEMS} entries")
    return child
