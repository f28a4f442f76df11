"""JSON from files that may be hostile: size and nesting bounded before parsing, in bounded memory.

``json.loads`` recurses once per nesting level, so a file of a million ``[`` raises
``RecursionError`` (or worse) instead of a typed error. :func:`loads_bounded` scans the text
once (no recursion, no backtracking: a few copies of the text at most) and refuses deeper
nesting before parsing it. The parse itself costs what the record's objects cost: a few bytes
per byte for strings and numbers, at most about 25 for a record of nothing but empty
containers, so every caller bounds the record's size.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a record read from a file."""

_STRING = re.compile(r'"[^"]*"')
"""A string once its escapes are gone: a single-character repeat, matched without a stack."""
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_STEP = tuple(1 if c in b"[{" else -1 if c in b"]}" else 0 for c in range(256))
"""How each byte of the brackets changes the depth."""


def _without_strings(text: str) -> str:
    r"""``text`` with every string's content removed (its quotes kept).

    In JSON a backslash escapes the character after it, and a run of backslashes pairs up from
    its left; removing the pairs, then the escaped quotes, leaves strings whose only quotes are
    their ends. (A pattern with an alternation per character, ``"(?:[^"\\]|\\.)*"``,
    keeps a backtracking frame per character: about 140 bytes of memory per byte of string.)
    """
    return _STRING.sub('""', text.replace("\\\\", "").replace('\\"', ""))


def nesting_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in JSON text, ignoring brackets inside strings.

    Runs in C over the brackets alone (no Python step per character), in memory about the
    text's size.
    """
    brackets = _NOT_BRACKETS.sub("", _without_strings(text)).encode("ascii")
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets)), default=0))


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
