"""The whole-model stateful candidates for ``generate``, tried before any per-layer graph.

A ``generate`` call's time is its decode steps, and a decode step of a small model is mostly
the overhead around each layer's kernels: the whole forward as one stateful OpenVINO model
(:mod:`.stateful`) is built first, checked against eager (:mod:`.stateful_check`: tokens
equal and teacher-forced logits within the tolerances, on the tuning prompts and held-out
probes of other batch sizes and lengths) and measured end to end beside the untuned model.
Under an accuracy budget the reduced-precision configs (bf16 compute where the CPU has bf16
units, 8- and 4-bit weights) are tried too, each admitted only by its teacher-forced error; they
change results and are never tried otherwise. Every config becomes a row of the result's
table, with its reason when it fails.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._util.table import format_table
from ..accuracy.budget import AccuracyBudget
from ..candidates.budget import TIME_BUDGET_ERROR, Deadline
from ..errors import TunetreeError
from ..signature.compare import Tolerances
from ..signature.graph import Sample
from ..signature.modules import CallFn
from .choosing import Measure, Trial, measure_and_choose
from .stateful import (
    Exported,
    StatefulConfig,
    attach,
    bf16_reason,
    envelope,
    export_whole,
    runner_for,
    unavailable_reason,
)
from .stateful_check import CheckReport, EagerReferences, check, probes, prompt_of

log = logging.getLogger(__name__)


@dataclass
class StatefulTrial(Trial):
    """One config of the whole-model stateful runner: built, checked, measured, or why not."""

    config: StatefulConfig
    report: CheckReport | None = None

    def cells(self) -> list[str]:
        """The trial's row of :func:`trials_table`."""
        report = self.report
        return [
            ("*" if self.chosen else "") + self.config.label,
            "keeps results" if self.config.preserves_results else "CHANGES RESULTS",
            str(self.timing) if self.timing else "-",
            f"{self.speedup:.2f}x" if self.speedup else "-",
            "-" if report is None else ("equal" if report.tokens_equal else "differ"),
            "-" if report is None else f"{100 * report.top1:.1f}%",
            "-" if report is None or report.error is None else f"{report.error:.3g}",
            self.status + (f": {self.reason}" if self.reason else ""),
        ]


def trials_table(trials: Sequence[StatefulTrial]) -> str:
    """The trials as a table ("" when there were none)."""
    if not trials:
        return ""
    headers = [
        "whole model, stateful",
        "results",
        "latency",
        "speedup",
        "tokens",
        "top-1",
        "error",
        "status",
    ]
    return format_table(
        headers,
        [t.cells() for t in trials],
        title="generate served whole by one stateful OpenVINO model (tried first)",
    )


def configs(accuracy: AccuracyBudget | None) -> list[StatefulConfig]:
    """The configs to try: f32 alone, or with a budget also bf16 and 8- and 4-bit weights.

    In the order a time budget should spend on them: the smallest change of results first
    (bf16 compute, then 8-bit weights, then both), 4-bit weights, the likeliest to be over a
    tight budget, last. 8-bit weights per output channel come before per group of inputs,
    which is built only when per channel is over the budget (:func:`superseded`).
    """
    found = [StatefulConfig()]
    if accuracy is None or accuracy.max_error is None:
        return found
    precisions = ["f32", "bf16"] if bf16_reason() is None else ["f32"]
    found += [StatefulConfig(precision=p) for p in precisions[1:]]
    for precision in precisions:
        found.append(StatefulConfig(precision=precision, weights="int8-channel"))
        found.append(StatefulConfig(precision=precision, weights="int8"))
    found.append(StatefulConfig(weights="int4"))
    return found


def superseded(trial: StatefulTrial, trials: Sequence[StatefulTrial]) -> str | None:
    """Why ``trial`` need not be built: 8 bits per group where per channel passed, or None.

    Per output channel reads fewer bytes per step than per group (no scale and zero point per
    group); groups only buy a smaller error, which matters only when per channel is over the
    budget.
    """
    config = trial.config
    if config.weights != "int8":
        return None
    for other in trials:
        same = other.config.precision == config.precision
        if same and other.config.weights == "int8-channel" and other.status == "passed":
            return "8-bit weights per channel passed the budget (fewer bytes than per group)"
    return None


def try_stateful(
    model: Any,
    samples: Sequence[Sample],
    call: CallFn | None,
    measure: Measure,
    *,
    accuracy: AccuracyBudget | None = None,
    held: Sequence[Sample] = (),
    tolerances: Tolerances | None = None,
    deadline: Deadline | None = None,
) -> list[StatefulTrial]:
    """Build, check and measure every config (see the module's docstring); the best is chosen.

    The chosen trial (``chosen=True``) is the fastest that passed its check and beats the
    untuned model; its ``model`` serves ``generate``. Nothing raises: a failure is a row.
    With ``deadline``, a config after the first is not started when less time is left than
    the first one's build and check took, and nothing is measured once it has passed (those
    configs' rows say so).
    """
    trials = [StatefulTrial(c) for c in configs(accuracy)]
    reason = unavailable_reason(model)
    if reason is None and any(prompt_of(s) is None for s in samples):
        reason = "the dataset's items are not generate calls with input_ids"
    if reason is not None:
        for trial in trials:
            trial.status, trial.reason = "unavailable", reason
        return trials
    start = time.perf_counter()
    try:
        exported = export_whole(model)
    except TunetreeError as exc:
        for trial in trials:
            trial.status, trial.reason = "failed", str(exc)
        return trials
    export_s = time.perf_counter() - start
    vocab = int(getattr(model.config, "vocab_size", 2))
    room = envelope(model, exported.shape, StatefulConfig()) - _new_tokens(model, samples, call)
    checked = [*samples, *held, *probes(samples, vocab, room)]
    first_s: float | None = None
    references = EagerReferences(model, call)  # eager runs once for every config's check
    for trial in trials:
        if (why := _not_started(trial, trials, first_s, deadline)) is not None:
            trial.status, trial.reason = "skipped", why
            continue
        started = time.perf_counter()
        _build_and_check(trial, model, exported, checked, call, accuracy, tolerances, references)
        first_s = time.perf_counter() - started if first_s is None else first_s
        if trial.build_s is not None:
            trial.build_s += export_s
    if deadline is not None and deadline.passed():
        for trial in trials:
            if trial.status == "passed":
                trial.status, trial.model = "skipped", None
                trial.reason = f"{TIME_BUDGET_ERROR} before it was measured"
    measure_and_choose(trials, model, measure)
    return trials


def _not_started(
    trial: StatefulTrial,
    trials: Sequence[StatefulTrial],
    first_s: float | None,
    deadline: Deadline | None,
) -> str | None:
    """Why ``trial`` is skipped: too little time left for it, or :func:`superseded`."""
    if first_s is not None and deadline is not None and deadline.left_s() < first_s:
        return f"{TIME_BUDGET_ERROR} ({deadline.left_s():.0f} s left)"
    return superseded(trial, trials)


def _build_and_check(
    trial: StatefulTrial,
    model: Any,
    exported: Exported,
    samples: Sequence[Sample],
    call: CallFn | None,
    accuracy: AccuracyBudget | None,
    tolerances: Tolerances | None,
    references: EagerReferences,
) -> None:
    config = trial.config
    if config.precision == "bf16" and (reason := bf16_reason()) is not None:
        trial.status, trial.reason = "unavailable", reason
        return
    start = time.perf_counter()
    try:
        runner = runner_for(exported, config)
    except TunetreeError as exc:
        trial.status, trial.reason = "failed", str(exc)
        return
    except RuntimeError as exc:  # OpenVINO's own errors
        trial.status, trial.reason = "failed", f"OpenVINO: {str(exc).strip()[:200]}"
        return
    trial.build_s = time.perf_counter() - start
    limit = envelope(model, exported.shape, config)
    tuned = attach(model, runner, exported.output_type, limit, config)
    if config.preserves_results:
        report = check(model, tuned, samples, call, tolerances=tolerances, references=references)
    else:
        assert accuracy is not None
        report = check(
            model, tuned, samples, call, metric=accuracy.metric, max_error=accuracy.max_error,
            references=references,
        )  # fmt: skip
    trial.report = report
    served = tuned.__dict__["forward"].counts
    if served.original:
        reasons = "; ".join(sorted(served.reasons))
        report_problem = f"{served.original} calls ran the original forward ({reasons})"
    else:
        report_problem = report.problem
    if report_problem:
        trial.status, trial.reason = "rejected", report_problem
        return
    if not config.preserves_results:
        record_accuracy(tuned, accuracy, report)
    trial.status, trial.model = "passed", tuned


def record_accuracy(tuned: Any, accuracy: AccuracyBudget | None, report: CheckReport) -> None:
    """Put the budget a results-changing config was admitted under into its saved record.

    A budget of a callable metric is not recorded (a load could not measure it again), so
    such a model is not saved: its record keeps no accuracy, and the load refuses it.
    """
    forward = tuned.__dict__["forward"]
    if accuracy is None or forward.record is None or report.error is None:
        return
    if not isinstance(accuracy.metric, str) or accuracy.max_error is None:
        return
    forward.record["accuracy"] = {
        "metric": accuracy.metric,
        "max_error": float(accuracy.max_error),
        "error": float(report.error),
    }


def _new_tokens(model: Any, samples: Sequence[Sample], call: CallFn | None) -> int:
    """How many tokens one ``generate`` of the first sample adds (for the probes' room)."""
    from ..signature.modules import run_model

    prompt = prompt_of(samples[0]) if samples else None
    if prompt is None:
        return 0
    out = run_model(model, samples[0], call)
    sequences = out if hasattr(out, "shape") else getattr(out, "sequences", None)
    return int(sequences.shape[1] - prompt["input_ids"].shape[1]) if sequences is not None else 0
