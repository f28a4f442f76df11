"""Plain-text tables for ``print()`` of results (no colour codes, so logs stay readable)."""

from __future__ import annotations

import datetime
import math
import unicodedata
from collections.abc import Sequence


def escape_controls(text: object) -> str:
    r"""``str(text)`` with control and format characters written as ``\xNN`` / ``\uNNNN``.

    Control and format characters are terminal escape sequences, new lines, bidi overrides:
    text read from a file is printed as data, never interpreted by the terminal.
    """
    out = []
    for char in str(text):
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> str:
    """Left-aligned columns separated by two spaces, a rule under the header."""
    cells = [[escape_controls(h) for h in headers]]
    cells += [["" if c is None else escape_controls(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [title] if title else []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_seconds(seconds: float | None) -> str:
    """Latency in the unit that reads best: ``1.23 ms``."""
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def format_size(size: float) -> str:
    """A byte count in B, KiB, MiB or GiB for display."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def format_time(timestamp: float | None) -> str:
    """A local date and time (``2026-12-05 14:03``) for seconds since the epoch.

    ``-`` for none (0 or None); ``?`` for what no date can show (NaN, infinite, out of range),
    as a hostile or damaged record may hold.
    """
    if not timestamp:
        return "-"
    try:
        return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, ValueError, OSError, TypeError):
        return "?"


def finite_or_none(value: float) -> float | None:
    """``value``, or None where JSON cannot hold it (NaN, infinite)."""
    return value if isinstance(value, int | float) and math.isfinite(value) else None
