"""auto_tune's first step for ``generate`` on the CPU: the whole model as one stateful runner.

Before any depth is cut, :func:`tunetree.generation.stateful_trial.try_stateful` builds,
checks and measures the whole forward as one stateful OpenVINO model. When one of its
configs beats the untuned model, that model is the result and no depth is tuned (every depth
row says why): a per-layer plan hands the cache across Python at every layer and step, which
a model that keeps it inside the runtime does not. Otherwise its rows stay in the result and
the depths are searched as usual. A strategy without OpenVINO (the caller chose its backends)
skips this step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..candidates.budget import BUILD, now
from ..generation.stateful_trial import StatefulTrial, try_stateful
from ..signature.graph import Sample
from .auto_result import AutoTuneResult, DepthRow, DepthStatus
from .depths import DepthRun


def stateful_first(
    run: DepthRun,
    rows: list[DepthRow],
    held: Sequence[Any],
    device: torch.device,
    time_budget: float | None,
    start: float,
) -> tuple[AutoTuneResult | None, list[StatefulTrial]]:
    """The result served by a stateful whole-model runner, or None and the trials' rows.

    ``time_budget`` and ``start`` (``now()`` when tuning began) complete the result.
    """
    if not run.generation or device.type != "cpu":
        return None, []
    if not any(b.kind.startswith("openvino") for b in run.strategy.backends):
        return None, []  # a strategy without OpenVINO was asked for: its backends only
    run.progress("generate: the whole model as one stateful OpenVINO model, tried first")
    with run.clock.phase(BUILD, "whole-model stateful"):
        trials = try_stateful(
            run.model,
            run.info.samples,
            run.call,
            run.measure,
            accuracy=run.accuracy.budget if run.accuracy is not None else None,
            held=[_sample(item) for item in held],
            tolerances=run.tolerances,
        )
    chosen = next((t for t in trials if t.chosen), None)
    if chosen is None:
        return None, trials
    for row in rows:
        row.status = DepthStatus.SKIPPED
        row.error = f"the whole-model stateful runner serves generate ({chosen.speedup:.2f}x)"
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
        accuracy=run.accuracy.budget if run.accuracy is not None else None,
    )
    return result, trials


def _sample(item: Any) -> Sample:
    """A held-out dataset item as a sample (a dict is keyword arguments, else positional)."""
    if isinstance(item, Sample):
        return item
    if isinstance(item, dict):
        return Sample((), dict(item))
    return Sample(tuple(item) if isinstance(item, (tuple, list)) else (item,), {})
