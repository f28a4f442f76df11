"""Where the peak of CUDA memory comes from while tuning (issue 28: peak within 1.5x eager's).

``traced()`` records the caching allocator's history (``torch.cuda.memory._record_memory_history``,
Python stacks only) and logs each tunetree INFO record with the memory allocated and the peak since
the record before, so a phase that peaks can be named. ``peak_breakdown()`` replays the recorded
allocations, finds the moment of the peak and groups what was alive then by the innermost tunetree
frame that allocated it (else the innermost frame at all): the table says which code holds the
memory at the peak, not only how much there was. ``held_by()`` walks a tuning result's
references and charges each tensor it reaches to the nearest tunetree or transformers object:
what the tuned model keeps after tuning.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch

_GIB = 2**30
_MAX_ENTRIES = 8_000_000
"""Allocator events the trace keeps (a ring buffer: the oldest go first)."""


class _MemoryLog(logging.Handler):
    """Prints each record with the memory allocated now and the peak since the last record."""

    def emit(self, record: logging.LogRecord) -> None:
        now = torch.cuda.memory_allocated() / _GIB
        peak = torch.cuda.max_memory_allocated() / _GIB
        print(f"[mem {now:6.2f} GiB, peak so far {peak:6.2f}] {record.getMessage()[:160]}",
              flush=True)  # fmt: skip


@contextlib.contextmanager
def traced(max_entries: int = _MAX_ENTRIES) -> Iterator[dict[str, Any]]:
    """Record allocations and annotate tunetree's log with memory while the block runs.

    Yields a dict that holds the allocator's snapshot (``"snapshot"``) once the block ends;
    recording stops then, also when the block raises.
    """
    logger = logging.getLogger("tunetree")
    handler = _MemoryLog(level=logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    recorded: dict[str, Any] = {}
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        yield recorded
    finally:
        recorded["snapshot"] = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        logger.removeHandler(handler)
        logger.setLevel(level)


def _site(frames: list[dict[str, Any]]) -> tuple[str, str]:
    """The innermost tunetree frame (else the innermost frame), and up to 7 tunetree callers."""
    ours = [f for f in frames if "/tunetree/" in f.get("filename", "")]
    pick = ours[0] if ours else (frames[0] if frames else {})
    name = pick.get("filename", "?").split("/")[-1]
    where = f"{name}:{pick.get('line', '?')} {pick.get('name', '')}"
    chain = " < ".join(f"{f['filename'].split('/')[-1]}:{f['line']}" for f in ours[1:8])
    return where, chain


def peak_breakdown(snapshot: dict[str, Any], base_bytes: int, top: int = 15) -> str:
    """The allocations alive at the recorded peak of ``snapshot``, by the code behind them.

    ``base_bytes`` is what was allocated when recording began (its blocks have no recorded stack).
    """
    events = [e for trace in snapshot.get("device_traces", []) for e in trace]
    current = peak = 0
    peak_at = -1
    live: dict[int, int] = {}
    freed: set[int] = set()
    for i, event in enumerate(events):
        action, addr, size = event.get("action"), event.get("addr"), int(event.get("size", 0))
        if action == "alloc":
            live[addr] = size
            freed.discard(addr)
            current += size
        elif action in ("free_requested", "free_completed"):
            if addr in freed:
                continue
            freed.add(addr)
            current -= live.pop(addr, size)
        if current > peak:
            peak, peak_at = current, i
    groups: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    alive: dict[int, dict[str, Any]] = {}
    for event in events[: peak_at + 1]:
        action, addr = event.get("action"), event.get("addr")
        if action == "alloc":
            alive[addr] = event
        elif action in ("free_requested", "free_completed"):
            alive.pop(addr, None)
    for event in alive.values():
        group = groups[_site(event.get("frames", []))]
        group[0] += int(event.get("size", 0))
        group[1] += 1
    full = " (ring buffer full: the earliest are missing)" if len(events) >= _MAX_ENTRIES else ""
    lines = [
        f"memory trace: {len(events)} events{full}; allocated when tuning began "
        f"{base_bytes / _GIB:.2f} GiB; recorded peak {peak / _GIB:.2f} GiB above it "
        f"(event {peak_at}); alive then, by site:"
    ]
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])
    for (where, chain), (size, count) in ranked[:top]:
        lines.append(f"  {size / _GIB:7.3f} GiB {count:6d} blocks  {where}  [{chain}]")
    rest = sum(size for _, (size, _) in ranked[top:])
    lines.append(f"  {rest / _GIB:7.3f} GiB in {max(0, len(ranked) - top)} other sites")
    return "\n".join(lines)


def held_by(root: Any, model: Any, device: str = "cuda", top: int = 12) -> str:
    """The tensors on ``device`` reachable from ``root`` (a tuning result), by holder.

    A walk over references from ``root`` (``gc.get_referents``, one visit per object): each
    tensor is charged to the nearest tunetree or transformers object on the way to it, and
    ``model``'s own parameters and buffers are left out. What keeps memory after tuning.
    """
    import gc
    import types

    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen_storages: set[int] = set()
    visited: set[int] = set()
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    frontier: list[tuple[Any, str]] = [(root, type(root).__name__)]
    while frontier:
        nxt: list[tuple[Any, str]] = []
        for obj, label in frontier:
            if id(obj) in visited:
                continue
            visited.add(id(obj))
            if type(obj) in (torch.Tensor, torch.nn.Parameter):
                try:
                    if obj.device.type != device:
                        continue
                    storage = obj.untyped_storage()
                    ptr = storage.data_ptr()
                except Exception:  # fake or functional tensors
                    continue
                if ptr and ptr not in own and ptr not in seen_storages:
                    seen_storages.add(ptr)
                    groups[label][0] += storage.nbytes()
                    groups[label][1] += 1
                continue
            if isinstance(obj, type | types.ModuleType):
                continue  # through a function's globals every module would be reached
            if isinstance(obj, torch.nn.Module) and obj is not root:
                continue  # the model's own state, not tuning's
            module = type(obj).__module__ or ""
            here = (
                f"{type(obj).__name__} ({module.split('.')[-1]})"
                if module.startswith(("tunetree", "transformers"))
                else label
            )
            nxt.extend((child, here) for child in gc.get_referents(obj))
        frontier = nxt
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])
    total = sum(g[0] for g in groups.values())
    lines = [f"held by the tuning result beside the model: {total / _GIB:.3f} GiB, by holder"]
    for label, (size, count) in ranked[:top]:
        lines.append(f"  {size / _GIB:7.3f} GiB {count:6d} storages  {label}")
    return "\n".join(lines)
