"""JSON from files that may be hostile: size and nesting bounded before parsing.

``json.loads`` recurses once per nesting level, so a file of a million ``[`` raises
``RecursionError`` (or worse) instead of a typed error. :func:`loads_bounded` scans the text
once (cheap, no recursion) and refuses deeper nesting before parsing it.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a record read from a file."""


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in JSON text, ignoring brackets inside strings."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRING.sub("", text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads_bounded(data: bytes | str, limit: int, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON of at most ``limit`` bytes and ``max_depth`` nesting levels.

    Raises ``ValueError`` (``UnicodeDecodeError`` and ``json.JSONDecodeError`` are ValueErrors) for
    anything else: too large, too deep, not UTF-8, not JSON.
    """
    if len(data) > limit:
        raise ValueError(f"{len(data)} bytes, over the limit of {limit}")
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    if nesting_depth(text) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except RecursionError as exc:  # cannot happen below max_depth; kept typed regardless
        raise ValueError("nested too deeply") from exc
