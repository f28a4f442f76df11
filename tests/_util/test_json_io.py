"""Bounded JSON: nesting refused before parsing, in memory a few times the record's size.

Before, the nesting scan stripped strings with a pattern that kept a backtracking frame per
character: about 140 bytes of memory per byte of a string (a 16 MiB string field took 2.2 GB).
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunetree._util.json_io import loads_bounded, nesting_depth

MIB = 1 << 20


def _peak(call: Any) -> int:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "field",
    [
        "x" * (16 * MIB),
        "\\n" * (8 * MIB),  # escapes
        '\\"' * (8 * MIB),  # escaped quotes
        "\\\\" * (8 * MIB),  # escaped backslashes
        "[{" * (8 * MIB),  # brackets inside a string are no nesting
    ],
    ids=["plain", "escapes", "quotes", "backslashes", "brackets"],
)
def test_a_16_mib_string_field_is_parsed_in_a_few_times_its_size(field: str) -> None:
    record = ('{"a": "' + field + '", "b": [[1]]}').encode()
    peak = _peak(lambda: loads_bounded(record, 32 * MIB))
    assert peak < 4 * len(record), f"{peak / len(record):.1f} bytes per byte"


def test_records_past_the_limit_or_the_depth_are_refused_typed() -> None:
    with pytest.raises(ValueError, match="over the limit"):
        loads_bounded(b"[" + b"0," * MIB + b"0]", MIB)
    with pytest.raises(ValueError, match="nested deeper"):
        loads_bounded(b"[" * 65 + b"]" * 65, MIB)
    assert loads_bounded(b"[" * 64 + b"]" * 64, MIB) is not None


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


_TEXT = st.text(alphabet='ab"\\[]{}/\n\u00e9\U0001f600', max_size=8)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON, st.booleans())
def test_the_nesting_scan_agrees_with_the_parse(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert nesting_depth(text) == _depth(value)
    assert loads_bounded(text, MIB) == value
