"""The calls the JIT keeps to tune on: one per exact signature, bounded in count and bytes.

A call repeating a signature already kept adds nothing to the ranges :func:`tunetree.auto_tune`
infers, so only the first call of each exact signature (shapes, dtypes, constants) is kept, as
a copy (the caller may reuse its tensors). The recorded mix is therefore one call per shape,
not the traffic's weights. When the count or byte bound is reached, the oldest kept call makes
room for a new signature (ranges follow recent traffic).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from ..signature.graph import GraphKey, Sample, detach_clone, flatten

DEFAULT_MAX_CALLS = 32
DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_TUNE_AFTER = 8
DEFAULT_TUNE_AFTER_CALLS = 64


@dataclass(frozen=True)
class RecordLimits:
    """How much the JIT records and when it starts tuning.

    Attributes:
        max_calls: most calls kept (one per exact signature; default 32).
        max_bytes: most tensor bytes kept over all calls (default 256 MiB); a single call
            larger than this is never kept.
        tune_after: distinct signatures seen before tuning starts (default 8).
        tune_after_calls: calls served before tuning starts even with fewer distinct
            signatures (default 64: a service with one or two shapes gets tuned too).
        retune_share: share of the calls after a swap that ran outside the tuned ranges
            (the original forward) above which a re-tune widens them (default 0.2).
        retune_min_calls: outside calls needed before that share counts (default 8).
    """

    max_calls: int = DEFAULT_MAX_CALLS
    max_bytes: int = DEFAULT_MAX_BYTES
    tune_after: int = DEFAULT_TUNE_AFTER
    tune_after_calls: int = DEFAULT_TUNE_AFTER_CALLS
    retune_share: float = 0.2
    retune_min_calls: int = 8

    def __post_init__(self) -> None:
        from ..errors import InvalidInputError

        if min(self.max_calls, self.max_bytes, self.tune_after, self.tune_after_calls) < 1:
            raise InvalidInputError("record limits must be positive")
        if not 0.0 < self.retune_share <= 1.0 or self.retune_min_calls < 1:
            raise InvalidInputError("retune_share must be in (0, 1], retune_min_calls >= 1")


def tensor_bytes(tree: Any) -> int:
    """Bytes of every tensor in a nested call."""
    leaves, _ = flatten(tree)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


class Recorder:
    """Thread-safe store of the calls kept (see the module docstring)."""

    def __init__(self, limits: RecordLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._kept: OrderedDict[GraphKey, tuple[Sample, int]] = OrderedDict()
        self._bytes = 0
        self.calls = 0
        """Calls offered since the last :meth:`mark`."""

    def offer(self, key: GraphKey, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Count a call and keep a copy of it when its signature is new (and it fits)."""
        with self._lock:
            self.calls += 1
            if key in self._kept:
                return
        size = tensor_bytes((args, kwargs))
        if size > self.limits.max_bytes:
            return
        copied = detach_clone((tuple(args), dict(kwargs)))
        with self._lock:
            if key in self._kept:
                return
            while self._kept and (
                len(self._kept) >= self.limits.max_calls
                or self._bytes + size > self.limits.max_bytes
            ):
                _, (_, dropped) = self._kept.popitem(last=False)
                self._bytes -= dropped
            self._kept[key] = (Sample(*copied), size)
            self._bytes += size

    def ready(self) -> bool:
        """Whether enough has been seen to start tuning."""
        with self._lock:
            return (
                len(self._kept) >= self.limits.tune_after
                or self.calls >= self.limits.tune_after_calls
            )

    def samples(self) -> list[Sample]:
        """The calls kept, oldest first."""
        with self._lock:
            return [sample for sample, _ in self._kept.values()]

    def replace(self, samples: list[Sample]) -> None:
        """Keep ``samples`` (calls read from the cache) in place of what was kept."""
        with self._lock:
            self._kept.clear()
            self._bytes = 0
            for sample in samples[-self.limits.max_calls :]:
                size = tensor_bytes((sample.args, sample.kwargs))
                self._kept[sample.key] = (sample, size)
                self._bytes += size

    def mark(self) -> None:
        """Start counting calls afresh (after a tune)."""
        with self._lock:
            self.calls = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

    @property
    def nbytes(self) -> int:
        """Tensor bytes kept."""
        return self._bytes
