"""The weights member's safetensors header, checked without loading a tensor.

``tunetree info`` has no model and loads no weights, yet must refuse what ``tt.load`` refuses
for the file (a SHA-256 alone would call a header length past the end of the member, a
negative or lying shape, or a pickle stored as weights "compatible"). Both read the header
here: its length within the member, JSON of bounded size and depth, every
tensor of a known dtype with a shape of sizes, and byte ranges that tile the data exactly
(what safetensors itself requires), so the fit to the model is all that is left to the load.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import IO, Any

from .._util.json_io import loads_bounded
from ..errors import CheckpointError

MAX_HEADER_BYTES = 100 << 20
"""Largest header accepted (safetensors' own limit)."""
MAX_TENSORS = 1_000_000
"""Most tensors a weights member may hold."""
MAX_METADATA_BYTES = 64 << 10
"""Largest ``__metadata__`` table accepted (tunetree writes one short entry)."""

ITEM_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
"""Bytes per element of every dtype a safetensors header may name."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the header: dtype name, shape and byte range in the data."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _refuse(why: str) -> CheckpointError:
    return CheckpointError(
        f"the saved weights cannot be read ({why}): the file is damaged or hostile; copy it "
        "again or save a new checkpoint"
    )


def read_header(stream: IO[bytes], size: int) -> dict[str, TensorEntry]:
    """The tensors of a safetensors member of ``size`` bytes, read from ``stream``'s start.

    Raises :class:`CheckpointError` for anything safetensors would not load.
    """
    head = stream.read(8)
    if len(head) != 8:
        raise _refuse("shorter than a safetensors header")
    (length,) = struct.unpack("<Q", head)
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise _refuse(f"a header of {length} bytes in a member of {size}")
    raw = stream.read(length)
    if len(raw) != length:
        raise _refuse("the header is cut short")
    try:
        table = loads_bounded(raw, MAX_HEADER_BYTES, max_depth=4)
    except ValueError as exc:
        raise _refuse(f"the header is not JSON: {exc}") from None
    if not isinstance(table, dict) or len(table) > MAX_TENSORS:
        raise _refuse("the header is not a table of tensors")
    return _entries(table, size - 8 - length)


def _entries(table: dict[str, Any], data_bytes: int) -> dict[str, TensorEntry]:
    entries = {}
    for name, meta in table.items():
        if name == "__metadata__":
            ok = isinstance(meta, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
            )
            if not ok:
                raise _refuse("its metadata is not a table of strings")
            size = sum(len(k) + len(v) for k, v in meta.items())
            if size > MAX_METADATA_BYTES:
                raise _refuse(f"its metadata holds {size} characters, over {MAX_METADATA_BYTES}")
            continue
        entries[name] = _entry(name, meta)
    position = 0
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != position:
            raise _refuse(f"tensor {name[:80]!r} does not start where the one before it ends")
        position = entry.end
    if position != data_bytes:
        raise _refuse(f"the tensors cover {position} of the {data_bytes} data bytes")
    return entries


def _entry(name: str, meta: Any) -> TensorEntry:
    if not isinstance(meta, dict) or set(meta) != {"dtype", "shape", "data_offsets"}:
        raise _refuse(f"tensor {name[:80]!r} is not described by dtype, shape and data_offsets")
    dtype, shape, offsets = meta["dtype"], meta["shape"], meta["data_offsets"]
    if dtype not in ITEM_BYTES:
        raise _refuse(f"tensor {name[:80]!r} has the unknown dtype {str(dtype)[:20]!r}")
    sizes_ok = isinstance(shape, list) and len(shape) <= 64
    if not sizes_ok or not all(_count(n) for n in shape):
        raise _refuse(f"tensor {name[:80]!r} has a shape that is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(n) for n in offsets)):
        raise _refuse(f"tensor {name[:80]!r} has data offsets that are not two positions")
    begin, end = offsets
    if end < begin or end - begin != math.prod(shape) * ITEM_BYTES[dtype]:
        raise _refuse(f"tensor {name[:80]!r}'s shape does not match its {end - begin} bytes")
    return TensorEntry(dtype, tuple(shape), begin, end)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62
