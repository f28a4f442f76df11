"""What the inspection keeps of each call: a full copy, or only its shape.

A sample is a copy of a call's inputs (and of eager's outputs), to build and check candidates
on. A step of ``generate`` takes the whole key/value cache: copying every step of every module
that receives it made tuning run out of device memory (126 GiB at batch 8 on a 0.6B model).
So copies are rationed:

- per graph (exact signature), at most ``max_samples`` copies, as before;
- a call that takes a cache (a generation step), and every call inside one, is copied at most
  ``per_item`` times per pattern (signature without sizes) and dataset item: the first steps
  of each ``generate``, never one per token;
- all copies together stay within ``max_bytes``, a share of the device's free memory and of
  the model's own size (the copied cache counted), except each pattern's first copy, without
  which its graph could not be tuned; calls of modules below the top take at most half of it,
  so the top's steps (what a depth-0 tune serves) keep room.

A call not copied is kept as its signature (:class:`Ledger` ``described``): its sizes still
widen its graph's ranges, and its count and time still say where the time goes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from ..hf import contains_cache
from .graph import GraphKey, Sample, flatten

log = logging.getLogger(__name__)

FREE_MEMORY_SHARE = 0.25
"""The share of the device's free memory that copies of recorded calls may take."""
MODEL_SHARE = 0.25
"""The most copies of recorded calls may take, as a share of the model's own bytes: on top of
the model, eager's working memory, the captures and one candidate's, tuning's peak should stay
within 1.5x of eager ``generate``'s (``benchmarks/generate.py --memory-trace`` measures it)."""
PER_ITEM = 2
"""Copies of one kind of generation step (one pattern) per dataset item."""
MIN_BUDGET_BYTES = 64 << 20
"""The least a budget is, whatever the free memory reads (a small machine still records)."""


def tensor_bytes(tree: object) -> int:
    """Bytes held by the tensors of a nested structure (cache objects included)."""
    leaves, _ = flatten(tree)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def free_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` (for the CPU, the system's available memory), or None."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        if device.type == "cpu":
            with open("/proc/meminfo") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
    except (OSError, RuntimeError, ValueError) as exc:
        log.debug("free memory of %s unknown: %s", device, exc)
    return None


def default_budget_bytes(device: torch.device, model_bytes: int = 0) -> int:
    """What copies of recorded calls may take on ``device``.

    :data:`FREE_MEMORY_SHARE` of its free memory, and with ``model_bytes`` (the model's
    parameters and buffers) at most :data:`MODEL_SHARE` of those: tuning's memory should stay
    within a small factor of the model's own (at least :data:`MIN_BUDGET_BYTES`).
    """
    free = free_bytes(device)
    budget = int(FREE_MEMORY_SHARE * free) if free is not None else 1 << 30
    if model_bytes:
        budget = min(budget, int(MODEL_SHARE * model_bytes))
    return max(MIN_BUDGET_BYTES, budget)


@dataclass
class GraphStats:
    """Calls of one exact signature of one module: how many, and their eager seconds."""

    calls: int = 0
    seconds: float = 0.0


@dataclass
class Ledger:
    """Decides which calls are copied, and counts what was copied and what was only described."""

    max_samples: int
    max_bytes: int
    per_item: int = PER_ITEM
    item: int = 0
    """Index of the dataset item being run (set by the inspection)."""
    copied: int = 0
    """Calls copied (as samples) so far."""
    copied_bytes: int = 0
    described: dict[str, dict[GraphKey, None]] = field(default_factory=dict)
    """Per module path, the exact signatures seen but not copied (their sizes widen ranges)."""
    stats: dict[tuple[str, GraphKey], GraphStats] = field(default_factory=dict)
    over_budget: int = 0
    """Calls left uncopied because the memory budget was used up."""
    _per_key: dict[tuple[str, GraphKey], int] = field(default_factory=dict)
    _per_pattern: dict[tuple[str, GraphKey, int], int] = field(default_factory=dict)
    _patterns: set[tuple[str, GraphKey]] = field(default_factory=set)

    def admit(
        self, path: str, sample: Sample, key: GraphKey, in_step: bool, depth: int = 0
    ) -> bool:
        """Whether to copy this call; counts it either way (see the module's rules).

        ``in_step``: the call takes a cache, or runs inside a call that does; ``depth``: how
        many module calls are open around it.
        """
        stats = self.stats.setdefault((path, key), GraphStats())
        stats.calls += 1
        if self._per_key.get((path, key), 0) >= self.max_samples:
            return False
        pattern = key.pattern()
        first = (path, pattern) not in self._patterns
        slot = (path, pattern, self.item)
        if in_step and not first and self._per_pattern.get(slot, 0) >= self.per_item:
            self._describe(path, key)
            return False
        if not first:
            size = 2 * tensor_bytes((sample.args, sample.kwargs))  # the inputs, and the outputs
            limit = self.max_bytes if depth == 0 else self.max_bytes // 2
            if self.copied_bytes + size > limit:
                self.over_budget += 1
                self._describe(path, key)
                return False
        self._patterns.add((path, pattern))
        self._per_key[(path, key)] = self._per_key.get((path, key), 0) + 1
        if in_step:
            self._per_pattern[slot] = self._per_pattern.get(slot, 0) + 1
        return True

    @staticmethod
    def takes_cache(sample: Sample) -> bool:
        """Whether the call takes a cache object (a generation step)."""
        return contains_cache((sample.args, sample.kwargs))

    def copied_now(self, nbytes: int) -> None:
        """Count one copy (a sample or its outputs) of ``nbytes``."""
        self.copied_bytes += nbytes

    def timed(self, path: str, key: GraphKey, seconds: float) -> None:
        """Add one call's eager seconds to its signature's total."""
        stats = self.stats.get((path, key))
        if stats is not None:
            stats.seconds += seconds

    def _describe(self, path: str, key: GraphKey) -> None:
        self.described.setdefault(path, {})[key] = None


@dataclass(frozen=True)
class RecordingSummary:
    """What an inspection copied and what it kept as signatures only (for tests and tables)."""

    samples: int
    """Calls copied as samples, over every module."""
    copied_bytes: int
    described: int
    """Distinct signatures seen but not copied, over every module."""
    over_budget: int
    """Calls left uncopied because the memory budget was used up."""
    budget_bytes: int
