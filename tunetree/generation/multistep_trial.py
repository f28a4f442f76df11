"""``generate`` on a GPU with several decode steps per replay, tried before any per-layer graph.

At batch 1 a small model's decode step is bound by the host, whichever runner serves the
forward: ``generate``'s own loop sets the pace. :class:`~.multistep_generate.MultiStepGenerate`
replaces that loop for greedy calls. Each config (steps per replay; eager's kernels, which keep
eager's numerics, or Inductor's code for the step) is built, checked against eager (tokens
equal on the tuning prompts, the held-out ones and probes of another batch size and length,
or parting only where eager's own two best logits are within the dtype's tolerance, see
:mod:`.near_tie`; and every check call served by the loop; each call from the same seed, so
a sampling call is compared draw for draw), then measured end to end beside the untuned model.
Every config is a row of the result's table with its reason when it fails; nothing raises.

Under a time budget (:mod:`.multistep_budget`) a config is started only when the time it is
expected to take and the measurement after it fit in what is left, it stops between its
check calls once the deadline has passed, and nothing is measured after the deadline.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._util.table import format_table
from ..candidates import budget
from ..candidates.budget import TIME_BUDGET_ERROR, Deadline
from ..signature.graph import Sample
from ..signature.modules import CallFn, run_model
from .choosing import Measure, Trial, measure_and_choose
from .multistep_budget import LoopBudget, compiles_for, timed_references
from .multistep_generate import MultiStepConfig, MultiStepGenerate
from .near_tie import TokenVerdict, judge_tokens
from .stateful_check import probes, prompt_of

log = logging.getLogger(__name__)


CONFIGS = (
    MultiStepConfig(steps=8),
    MultiStepConfig(steps=32),
    MultiStepConfig(16, True),
    MultiStepConfig(16, True, attention="eager"),
)
"""Tried in this order: eager's kernels at two replay lengths, then Inductor's step with the
model's attention and with Hugging Face's eager attention (fewer kernels per step than a fused
attention kernel's launches at batch 1: 12% less time per step on a 0.6B model in bf16)."""


@dataclass
class MultiStepTrial(Trial):
    """One config of the multi-step decode loop: built, checked, measured, or why not."""

    config: MultiStepConfig
    checked: int = 0
    """Check calls whose tokens passed (equal to eager's, or parting at a near-tie)."""
    near_ties: int = 0
    """Rows of the check calls that part from eager's tokens at one of eager's near-ties."""

    def cells(self) -> list[str]:
        """The trial's row of :func:`trials_table`."""
        return [
            ("*" if self.chosen else "") + self.config.label,
            str(self.timing) if self.timing else "-",
            f"{self.speedup:.2f}x" if self.speedup else "-",
            _tokens_cell(self.checked, self.near_ties),
            f"{self.build_s:.1f} s" if self.build_s is not None else "-",
            self.status + (f": {self.reason}" if self.reason else ""),
        ]


def _tokens_cell(checked: int, ties: int) -> str:
    if not checked:
        return "-"
    if not ties:
        return f"{checked} calls equal"
    return f"{checked} calls: equal but {ties} rows parting at eager's near-ties"


def trials_table(trials: Sequence[MultiStepTrial]) -> str:
    """The trials as a table ("" when there were none)."""
    if not trials:
        return ""
    headers = ["decode loop", "latency", "speedup", "tokens", "build", "status"]
    return format_table(
        headers,
        [t.cells() for t in trials],
        title="generate with several decode steps per CUDA graph replay (tried first)",
    )


def unavailable_reason(model: Any, device: torch.device) -> str | None:
    """Why the loop cannot serve ``model``'s ``generate`` at all (None when it may)."""
    if device.type != "cuda":
        return "needs a CUDA device"
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(model, "generate", None)):
        return "not a Hugging Face model with generate"
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    from transformers import StaticCache

    try:
        layers = StaticCache(config=config, max_cache_len=8).layers
    except (TypeError, ValueError, AttributeError) as exc:
        return f"no static cache for this model ({type(exc).__name__})"
    if any(getattr(layer, "is_sliding", False) for layer in layers):
        return "sliding-window cache layers"
    if any(type(layer).__name__ != "StaticLayer" for layer in layers):
        return "cache layers other than full attention"
    return None


def attach(model: Any, config: MultiStepConfig) -> Any:
    """A shallow copy of ``model`` whose ``generate`` the loop serves (forward unchanged)."""
    twin = copy.copy(model)  # shares parameters, buffers, submodules and hooks
    twin.__dict__["generate"] = MultiStepGenerate(model, model.generate, config)
    return twin


def try_multistep(
    model: Any,
    samples: Sequence[Sample],
    call: CallFn | None,
    measure: Measure,
    *,
    held: Sequence[Sample] = (),
    configs: Sequence[MultiStepConfig] = CONFIGS,
    deadline: Deadline | None = None,
) -> list[MultiStepTrial]:
    """Build, check and measure every config (see the module's docstring); the best is chosen.

    With ``deadline``, configs that do not fit in the time left are rows that say so.
    """
    trials = [MultiStepTrial(c) for c in configs]
    device = next(model.parameters()).device
    reason = unavailable_reason(model, device)
    if reason is None and any(prompt_of(s) is None for s in samples):
        reason = "the dataset's items are not generate calls with input_ids"
    if reason is not None:
        for trial in trials:
            trial.status, trial.reason = "unavailable", reason
        return trials
    vocab = int(getattr(model.config, "vocab_size", 2))
    room = int(getattr(model.config, "max_position_embeddings", 64)) // 4
    checks = [*samples, *held, *(_on(p, device) for p in probes(samples, vocab, room))]
    batches = {_batch(s) for s in checks}
    limits = LoopBudget(deadline, loops=len(batches), compiles=compiles_for(batches))
    expected = timed_references(checks, lambda sample: _seeded(model, sample, call), limits)
    log.debug("multi-step trial: eager's %d check calls took %.1f s", len(checks), limits.eager_s)
    if expected is None:
        for trial in trials:
            trial.status, trial.reason = "skipped", f"{TIME_BUDGET_ERROR} (eager's check calls)"
        return trials
    for trial in trials:
        compiled = trial.config.compiled
        skipped = limits.skip_reason(compiled)
        if skipped:
            trial.status, trial.reason = "skipped", skipped
            log.debug("multi-step trial: %s not started: %s", trial.config.label, skipped)
            continue
        started = budget.now()
        loops = _build_and_check(trial, model, checks, expected, call, limits.passed)
        limits.note(compiled, budget.now() - started, loops)
        log.debug("multi-step trial: %s %s after %.1f s (%d loops)", trial.config.label,
                  trial.status, budget.now() - started, loops)  # fmt: skip
    if limits.passed():
        for trial in trials:
            if trial.status == "passed":
                trial.status, trial.model = "skipped", None
                trial.reason = f"{TIME_BUDGET_ERROR} before it was measured"
    measure_and_choose(trials, model, measure)
    return trials


def _batch(sample: Sample) -> int:
    prompt = prompt_of(sample)
    return 1 if prompt is None else int(prompt["input_ids"].shape[0])


def _seeded(model: Any, sample: Sample, call: CallFn | None) -> Any:
    """One check call from a fixed seed, torch's generators restored after it."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        return run_model(model, sample, call)


def _on(sample: Sample, device: torch.device) -> Sample:
    return Sample((), {k: v.to(device) for k, v in sample.kwargs.items()})


def _build_and_check(
    trial: MultiStepTrial,
    model: Any,
    checks: Sequence[Sample],
    expected: Sequence[Any],
    call: CallFn | None,
    stop: Callable[[], bool] = lambda: False,
) -> int:
    """Build ``trial``'s loop through its check calls and judge them; the loops it built.

    ``stop`` is asked before each check call: when it says so, the trial is skipped there.
    """
    start = budget.now()
    served: MultiStepGenerate | None = None
    try:
        twin = attach(model, trial.config)  # another attention: a private copy set to it
        served = twin.__dict__["generate"]
        outputs: list[Any] = []
        for sample in checks:
            if stop():
                trial.status = "skipped"
                trial.reason = (
                    f"{TIME_BUDGET_ERROR}: stopped after {len(outputs)} of {len(checks)} "
                    "check calls"
                )
                return len(served.loops)
            outputs.append(_seeded(twin, sample, call))
    except (RuntimeError, TypeError, ValueError) as exc:  # a capture or compile that fails
        trial.status, trial.reason = "failed", f"{type(exc).__name__}: {str(exc)[:200]}"
        return 0 if served is None else len(served.loops)
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    trial.build_s = budget.now() - start
    counts = served.counts
    if counts.original:
        reasons = "; ".join(f"{n}x {r}" for r, n in counts.reasons.most_common())
        trial.status = "rejected"
        trial.reason = (
            f"{counts.original} of {len(checks)} calls ran the original generate ({reasons})"
        )
        return len(served.loops)
    for index, (sample, got, want) in enumerate(zip(checks, outputs, expected, strict=True)):
        verdict = _judge(model, sample, _tokens(got), _tokens(want))
        if verdict.problem:
            trial.status, trial.reason = "rejected", f"check call {index}: {verdict.problem}"
            return len(served.loops)
        trial.checked += 1
        trial.near_ties += verdict.near_ties
    trial.status, trial.model = "passed", twin
    return len(served.loops)


def _tokens(out: Any) -> torch.Tensor | None:
    return out if isinstance(out, torch.Tensor) else getattr(out, "sequences", None)


def _judge(
    model: Any, sample: Sample, got: torch.Tensor | None, want: torch.Tensor | None
) -> TokenVerdict:
    """The check call's tokens against eager's, up to eager's near-ties (:mod:`.near_tie`)."""
    prompt = prompt_of(sample)
    if got is None or want is None or prompt is None:
        return TokenVerdict(False, problem="no token ids to compare")
    return judge_tokens(model, got, want, prompt["attention_mask"])
