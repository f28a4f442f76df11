"""auto_tune's first step for ``generate`` on the CPU: the whole model as one stateful runner.

Where it applies (:func:`applies`: the CPU, a strategy with OpenVINO, a float32 decoder-only
Hugging Face model), auto_tune inspects the root alone (depth 0: enough to tell ``generate``
and to hold its calls), and :func:`tunetree.generation.stateful_trial.try_stateful` builds,
checks and measures the whole forward as one stateful OpenVINO model before any depth is
inspected or cut. When one of its configs beats the untuned model, that model is the result:
no deeper depth is inspected or tuned (the depth rows say why): a per-layer plan hands the
cache across Python at every layer and step, which a model that keeps it inside the runtime
does not. Otherwise its rows stay in the result and the depths are inspected and searched
as usual.

The trial watches the time budget: it is not started when less is left than it is expected
to take (:func:`expected_s`; its rows then say so), and inside it a config is not started
when less is left than the first one took.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from ..accuracy.budget import AccuracyBudget
from ..candidates.budget import BUILD, Deadline, now
from ..generation.stateful import unavailable_reason
from ..generation.stateful_trial import StatefulTrial, configs, try_stateful
from ..runtime.artifacts import parameter_bytes
from ..signature.graph import Sample
from .auto_result import AutoTuneResult, DepthRow, DepthStatus
from .depths import DepthRun

log = logging.getLogger(__name__)

EXPORT_MIN_S = 5.0
"""Seconds the export and compile of even the smallest model are expected to take."""
EXPORT_S_PER_GIB = 60.0
"""Seconds the export and compile are expected to take per GiB of float32 weights (a rough,
cautious bound)."""
EAGER_PASSES = 4
"""Passes over the tuning calls the trial is expected to cost beyond the export, counted in
the root inspection's time: about twice the 2.7 passes one measured trial took (export,
compile, check on the prompts and probes, measurement; docs/measurements.md)."""


def applies(model: Any, strategy_kinds: Sequence[str], device: torch.device) -> bool:
    """Whether the whole-model stateful trial may come first (decided before any inspection).

    The CPU, a strategy with an OpenVINO backend (a strategy without one was chosen for its
    backends only), and a model it can serve (:func:`.unavailable_reason`); whether the calls
    are ``generate``'s is known after the root's inspection.
    """
    if device.type != "cpu" or not any(k.startswith("openvino") for k in strategy_kinds):
        return False
    return unavailable_reason(model) is None


def expected_s(model: Any, pass_s: float) -> float:
    """Seconds the trial is expected to take: the export and compile, and its eager passes.

    ``pass_s``: one pass over the tuning calls (the root's inspection took about that).
    """
    gib = parameter_bytes(model) / 2**30 if isinstance(model, torch.nn.Module) else 0.0
    return EXPORT_MIN_S + EXPORT_S_PER_GIB * gib + EAGER_PASSES * pass_s


def stateful_first(
    run: DepthRun,
    rows: list[DepthRow],
    held: Sequence[Any],
    accuracy: AccuracyBudget | None,
    time_budget: float | None,
    start: float,
    pass_s: float,
) -> tuple[AutoTuneResult | None, list[StatefulTrial]]:
    """The result served by a stateful whole-model runner, or None and the trials' rows.

    ``time_budget`` and ``start`` (``now()`` when tuning began) complete the result;
    ``pass_s`` is how long one pass over the tuning calls took (see :func:`expected_s`).
    """
    if not run.generation:
        return None, []
    skipped = _no_room(run.model, run.deadline, accuracy, pass_s)
    if skipped:
        run.progress(f"generate: the whole model as one stateful model skipped ({skipped})")
        return None, _skipped(accuracy, skipped)
    run.progress("generate: the whole model as one stateful OpenVINO model, tried first")
    with run.clock.phase(BUILD, "whole-model stateful"):
        trials = try_stateful(
            run.model,
            run.info.samples,
            run.call,
            run.measure,
            accuracy=accuracy,
            held=[_sample(item) for item in held],
            tolerances=run.tolerances,
            deadline=run.deadline,
        )
    chosen = next((t for t in trials if t.chosen), None)
    if chosen is None:
        return None, trials
    for row in rows:
        row.status = DepthStatus.SKIPPED
        row.error = (
            f"the whole-model stateful runner serves generate ({chosen.speedup:.2f}x); "
            "deeper depths were not inspected"
        )
    result = AutoTuneResult(
        chosen.model,
        None,
        rows,
        chosen.untuned,
        chosen.untuned,
        info=run.info,
        original=run.model,
        stateful=trials,
        tuning_s=now() - start,
        breakdown=run.clock.breakdown(),
        time_budget=time_budget,
        accuracy=accuracy,
    )
    return result, trials


def _no_room(
    model: Any, deadline: Deadline | None, accuracy: AccuracyBudget | None, pass_s: float
) -> str:
    """Why the budget leaves no room for the trial ("" when it does)."""
    if deadline is None:
        return ""
    need, left = expected_s(model, pass_s), deadline.left_s()
    if left >= need:
        return ""
    return f"time budget: {left:.0f} s left, the whole-model trial is expected to take {need:.0f} s"


def _skipped(accuracy: AccuracyBudget | None, reason: str) -> list[StatefulTrial]:
    """The configs the trial would have tried, each a row that says why it was not."""
    trials = [StatefulTrial(c) for c in configs(accuracy)]
    for trial in trials:
        trial.status, trial.reason = "skipped", reason
    return trials


def _sample(item: Any) -> Sample:
    """A held-out dataset item as a sample (a dict is keyword arguments, else positional)."""
    if isinstance(item, Sample):
        return item
    if isinstance(item, dict):
        return Sample((), dict(item))
    return Sample(tuple(item) if isinstance(item, (tuple, list)) else (item,), {})
