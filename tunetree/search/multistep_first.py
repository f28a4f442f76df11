"""auto_tune's first step for ``generate`` on a GPU: several decode steps per graph replay.

Before any depth is cut, :func:`tunetree.generation.multistep_trial.try_multistep` builds,
checks and measures ``generate``'s greedy loop captured several steps at a time. When one of
its configs beats the untuned model, that model is the result and no depth is tuned (every
depth row says why); otherwise its rows stay in the result and the depths are searched as
usual. A strategy without device graphs (the caller chose its backends) skips this step.

Where it may serve the model (:func:`applies`), auto_tune inspects only the root before it
(enough to tell ``generate`` and to hold its calls; recording every call of every module down
to the deepest depth takes many passes' time over long ``generate`` calls), and the deeper
depths only when no config won. The trial watches the time budget
(:mod:`tunetree.generation.multistep_budget`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..candidates.budget import BUILD, now
from ..generation.multistep_trial import MultiStepTrial, try_multistep, unavailable_reason
from .auto_result import AutoTuneResult, DepthRow, DepthStatus
from .depths import DepthRun
from .stateful_first import _sample


def applies(model: Any, strategy_kinds: Sequence[str], device: torch.device) -> bool:
    """Whether the multi-step trial may come first (decided before any inspection).

    A CUDA device, a strategy with device graphs, and a model whose ``generate`` the loop
    can serve (:func:`~tunetree.generation.multistep_trial.unavailable_reason`); whether the
    calls are ``generate``'s is known after the root's inspection.
    """
    if device.type != "cuda" or "device-graph" not in strategy_kinds:
        return False
    return unavailable_reason(model, device) is None


def multistep_first(
    run: DepthRun,
    rows: list[DepthRow],
    held: Sequence[Any],
    device: torch.device,
    time_budget: float | None,
    start: float,
) -> tuple[AutoTuneResult | None, list[MultiStepTrial]]:
    """The result served by the multi-step decode loop, or None and the trials' rows."""
    if not run.generation or device.type != "cuda":
        return None, []
    if not any(b.kind == "device-graph" for b in run.strategy.backends):
        return None, []  # a strategy without device graphs was asked for: its backends only
    run.progress("generate: several decode steps per CUDA graph replay, tried first")
    with run.clock.phase(BUILD, "multi-step decode"):
        trials = try_multistep(
            run.model, run.info.samples, run.call, run.measure,
            held=[_sample(item) for item in held], deadline=run.deadline,
        )  # fmt: skip
    chosen = next((t for t in trials if t.chosen), None)
    if chosen is None:
        return None, trials
    for row in rows:
        row.status = DepthStatus.SKIPPED
        row.error = f"the multi-step decode loop serves generate ({chosen.speedup:.2f}x)"
    result = AutoTuneResult(
        chosen.model,
        None,
        rows,
        chosen.untuned,
        chosen.untuned,
        info=run.info,
        original=run.model,
        multistep=trials,
        tuning_s=now() - start,
        breakdown=run.clock.breakdown(),
        time_budget=time_budget,
    )
    return result, trials
