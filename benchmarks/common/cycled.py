"""Interleaved timing with the order of approaches cycled, in plain Python.

Used by ``benchmarks.generate_cpu`` (which calls its optimum-intel worker's approaches from the
same order), ``benchmarks.stateful_fusion_cpu`` and an investigation. Each round
runs every approach once, in an order that cycles through every permutation, so no approach
always follows the same one (a runtime's spinning thread pool slows whatever runs next).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable


def cycled_medians(approaches: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds of one call of each approach over ``rounds`` cycled rounds (warmed up)."""
    for fn in approaches.values():
        fn()
    names = list(approaches)
    orders = list(itertools.permutations(names)) if len(names) <= 4 else None
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = (
            orders[r % len(orders)] if orders else names[r % len(names) :] + names[: r % len(names)]
        )
        for name in order:
            start = time.perf_counter()
            approaches[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}
