"""A causal LM served whole by a stateful OpenVINO model, rebuilt from a checkpoint.

The checkpoint holds no OpenVINO model: only the weights (safetensors, as every checkpoint)
and the runner's config (:class:`tunetree.checkpoint.whole.WholeRecord`). The load applies
the weights to the fresh model, and :func:`rebuild` exports the stateful model again from
them with that config. This is safer than storing the IR: no runtime parses a model file that
came with the checkpoint, and the runner computes from the very weights the load validated,
not from a second copy that could differ from them in directions no probe spans. It is also
smaller (an f32 IR would store every weight again). The price is the export at load, seconds
for a small model; the environment record pins torch, transformers and OpenVINO, so the
export is the one tuning made.

The rebuilt model is checked against eager like a fresh build before it serves: greedy
``generate`` on probes of several batch sizes and lengths (one row left-padded), tokens
equal and teacher-forced logits within the tolerances, or, for a config that changes
results, within the accuracy budget the file records; a probe that the original forward had
to serve refuses it too.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..accuracy.metrics import METRICS
from ..checkpoint.whole import WholeRecord
from ..errors import (
    CheckpointError,
    IncompatibleCheckpointError,
    InvalidInputError,
    TunetreeError,
)
from ..signature.graph import Sample
from ..signature.state import eval_mode, preserved_state
from .stateful import (
    StatefulConfig,
    attach,
    bf16_reason,
    envelope,
    export_whole,
    runner_for,
    unavailable_reason,
)
from .stateful_check import CheckReport, check
from .stateful_forward import ServeCounts

log = logging.getLogger(__name__)

CHECK_TOKENS = 4
"""New tokens each check prompt generates."""
PROBES = ((1, 5), (3, 11), (1, 2))
"""Check prompts' (batch, length): the second has a left-padded row."""


def rebuild(model: nn.Module, whole: WholeRecord, device: torch.device) -> nn.Module:
    """``model`` (holding the saved weights) served by the recorded stateful runner, checked.

    Raises:
        IncompatibleCheckpointError: The runner cannot be built here (no OpenVINO, no bf16
            units, the model not on the CPU in float32).
        CheckpointError: The record is not a valid config, or the rebuilt runner does not
            match eager (or the recorded budget) on the check prompts.
    """
    config = _config(whole)
    reason = unavailable_reason(model)
    if reason is None and config.precision == "bf16":
        reason = bf16_reason()
    if reason is not None or device.type != "cpu":
        raise IncompatibleCheckpointError(
            f"the checkpoint's {config.label} runner cannot be rebuilt here: "
            f"{reason or f'it serves the CPU, not {device}'}"
        )
    with preserved_state(model), eval_mode(model):
        try:
            exported = export_whole(model)
            runner = runner_for(exported, config)
        except TunetreeError as exc:
            raise CheckpointError(
                f"the saved {config.label} runner cannot be rebuilt: {exc}"
            ) from exc
        except RuntimeError as exc:  # OpenVINO's own errors
            raise CheckpointError(
                f"the saved {config.label} runner cannot be rebuilt: OpenVINO: "
                f"{str(exc).strip()[:200]}"
            ) from exc
        limit = envelope(model, exported.shape, config)
        tuned = attach(model, runner, exported.output_type, limit, config)
        report = _check(model, tuned, whole, limit)
    forward = tuned.__dict__["forward"]
    if forward.counts.original:
        reasons = "; ".join(sorted(forward.counts.reasons))
        raise CheckpointError(
            f"the rebuilt {config.label} runner left {forward.counts.original} check calls "
            f"to the original forward ({reasons}): refused"
        )
    if report.problem:
        raise CheckpointError(
            f"the rebuilt {config.label} runner does not match eager on the model's own "
            f"weights ({report.problem}): refused"
        )
    forward.record["accuracy"] = whole.accuracy
    forward.counts = ServeCounts()  # the caller's calls only
    if not config.preserves_results:
        log.warning(
            "the model is served by %s, which CHANGES RESULTS: teacher-forced %s error %.3g at "
            "load, within the budget %g it was tuned under (greedy top-1 agreement %.1f%%)",
            config.label,
            (whole.accuracy or {}).get("metric"),
            report.error or 0.0,
            (whole.accuracy or {}).get("max_error"),
            100 * report.top1,
        )
    return tuned


def _config(whole: WholeRecord) -> StatefulConfig:
    """The recorded config, each field checked; a changing one must record its budget."""
    try:
        config = StatefulConfig(**whole.config)
    except (TypeError, InvalidInputError) as exc:
        raise CheckpointError(
            f"the checkpoint's stateful runner config is not valid ({exc}): the file is "
            "damaged or was altered"
        ) from exc
    accuracy = whole.accuracy
    if not config.preserves_results:
        if accuracy is None:
            raise CheckpointError(
                f"the checkpoint's {config.label} runner changes results but the file records "
                "no accuracy budget to check it against: refused"
            )
        if accuracy["metric"] not in METRICS:
            raise CheckpointError(
                f"the checkpoint's accuracy metric {accuracy['metric']!r} is not one of "
                f"{sorted(METRICS)}: refused"
            )
    return config


def _check(model: nn.Module, tuned: nn.Module, whole: WholeRecord, limit: int) -> CheckReport:
    """Greedy generate and teacher-forced logits of both models on :data:`PROBES`."""
    config = model.config  # type: ignore[union-attr]
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 2:
        raise CheckpointError("the model's config has no vocabulary size: cannot check it")
    room = max(limit - CHECK_TOKENS, 2)
    generator = torch.Generator().manual_seed(0)
    samples = []
    for batch, length in PROBES:
        length = min(length, room)
        ids = torch.randint(0, vocab, (batch, length), generator=generator)
        mask = torch.ones(batch, length, dtype=torch.long)
        if batch > 1 and length > 2:
            mask[-1, : length // 3] = 0
        samples.append(Sample((), {"input_ids": ids, "attention_mask": mask}))
    pad = _pad_token(model)

    def greedy(m: Any, **kwargs: Any) -> Any:
        return m.generate(**kwargs, max_new_tokens=CHECK_TOKENS, do_sample=False, pad_token_id=pad)

    accuracy = whole.accuracy
    if accuracy is None:
        return check(model, tuned, samples, greedy)
    return check(
        model,
        tuned,
        samples,
        greedy,
        metric=accuracy["metric"],
        max_error=accuracy["max_error"],
    )


def _pad_token(model: nn.Module) -> int:
    """The model's pad token, else its end-of-sequence token, else 0."""
    generation = getattr(model, "generation_config", None)
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(generation, name, None)
        if isinstance(value, list | tuple):
            value = value[0] if value else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0
