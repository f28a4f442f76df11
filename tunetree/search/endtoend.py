"""End-to-end measurement of one depth, side by side with the untuned model.

It includes the noise check and the single-runtime alternative to a plan that mixes runtimes.

A depth's ratio is only honest when the tuned and untuned models are timed in the same
interleaved ``candidates.measure`` call (a load change between two separate calls moves
every ratio). Runtimes' thread pools can disturb each other, so a plan whose graphs use
several runtimes may be slower end to end than its per-graph figures add up to: it is
measured against the plan that keeps to the runtime which won most graphs.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch

from ..candidates.budget import Deadline
from ..candidates.measure import MeasureConfig, Timing, cycle_calls, measure
from ..candidates.results import GraphResult
from ..runtime.plan import Plan, PlanEntry
from ..signature.compare import Tolerances, compare_all
from ..signature.graph import Sample
from ..signature.inspection import ModelInfo
from ..signature.modules import CallFn, run_model

UNTUNED = "untuned"


def side_by_side(
    models: Mapping[str, Any],
    info: ModelInfo,
    call: CallFn | None,
    config: MeasureConfig,
    deadline: Deadline | None = None,
    samples: list[Sample] | None = None,
) -> dict[str, Timing]:
    """Time every model (tuned or not) end to end over the inspected samples, interleaved.

    ``samples``: a subset of them to time on (a ``generate`` call is long: see
    :func:`tunetree.generation.end_to_end_samples`). The trial rounds stop at ``deadline``
    (see ``candidates.measure``).
    """
    timed = info.samples if samples is None else samples
    calls = {
        name: cycle_calls(lambda *a, m=model, **k: run_model(m, Sample(a, k), call), timed)
        for name, model in models.items()
    }
    return measure(calls, info.device, config, deadline)


def output_problem(
    info: ModelInfo, call: CallFn | None, tuned: Any, plan: Plan, given: Tolerances | None
) -> str:
    """Why ``tuned``'s outputs differ from eager's on every inspected sample ("" when they match).

    Compared with :func:`end_to_end_tolerances` of ``plan``.
    """
    with torch.no_grad():
        outputs = [run_model(tuned, s, call) for s in info.samples]
    check = compare_all(info.outputs, outputs, end_to_end_tolerances(plan, given))
    return "" if check.ok else check.reason


def end_to_end_tolerances(plan: Plan, given: Tolerances | None) -> Tolerances | None:
    """Tolerances for the whole model's output.

    The caller's, else the loosest of the opt-in backends in the plan (a user who opted into bf16
    accepted its error), else the defaults.
    """
    if given is not None:
        return given
    loose = [t for e in plan.entries if (t := e.backend.tolerances()) is not None]
    if not loose:
        return None
    atol = max(tol.atol for t in loose for tol in t.by_dtype.values())
    rtol = max(tol.rtol for t in loose for tol in t.by_dtype.values())
    return Tolerances.uniform(atol, rtol)


def too_noisy(timings: Mapping[str, Timing]) -> bool:
    """Whether the measurement cannot separate the timings a decision rests on.

    True when the timings' spread is larger than the gap between any two of them that a decision
    rests on (the closest pair).
    """
    values = sorted(timings.values(), key=lambda t: t.median_s)
    for a, b in itertools.pairwise(values):
        gap = b.median_s - a.median_s
        spread = max(a.q3_s - a.q1_s, b.q3_s - b.q1_s)
        if spread > gap:
            return True
    return False


def load_text() -> str:
    """The load average and CPU count, as a likely cause of noisy timings."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:  # not available on this platform
        return "the machine's load is unknown"
    return f"load average {one:.2f} (5 min {five:.2f}) on {os.cpu_count()} CPUs"


def single_runtime_plan(results: list[GraphResult], depth: int) -> Plan | None:
    """Every graph on the runtime that won most graphs (its best usable row).

    Eager where that runtime has no usable row; None when the greedy plan already uses one runtime.
    """
    kinds = Counter(
        g.winner.backend.kind
        for g in results
        if g.winner is not None and g.winner.backend.kind != "eager"
    )
    if len(kinds) < 2:
        return None
    kind = kinds.most_common(1)[0][0]
    entries = []
    for g in results:
        usable = [r for r in g.rows if r.usable and r.timing is not None]
        same = [r for r in usable if r.backend.kind == kind]
        eager = [r for r in usable if r.backend.kind == "eager"]
        row = min(same or eager, key=lambda r: r.latency_s or float("inf"), default=None)
        if row is not None and row.runner is not None:
            entries.append(
                PlanEntry(
                    g.path, g.graph.key, row.backend, row.runner, row.latency_s, g.eager_latency_s
                )
            )
    return Plan(entries, depth)


def runtime_name(plan: Plan) -> str:
    """``openvino-only`` or ``mixed (a, b)``: how a plan's runtimes are described."""
    kinds = sorted({e.backend.kind for e in plan.entries if e.backend.kind != "eager"})
    return f"{kinds[0]}-only" if len(kinds) == 1 else f"mixed ({', '.join(kinds)})"
