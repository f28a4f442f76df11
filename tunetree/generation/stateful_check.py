"""Checking a stateful generation model against eager: tokens, and logits teacher-forced.

For every check prompt (the tuning prompts and probes of other batch sizes and lengths, a
left-padded row among them) both models ``generate`` as the user calls them, and the tokens
must be equal (for a results-keeping runner). Logits are judged *teacher-forced*: each model
runs eager's token sequence the way ``generate`` does (a prefill of the prompt, then one
token per step on its own cache), so the tuned model's prefill and every decode step are
compared with fp32 eager's on the same inputs, and the greedy top-1 agreement is how often
the tuned model's most likely next token is the one eager generated.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..accuracy.metrics import Metric, call_error
from ..signature.compare import Tolerances, compare
from ..signature.graph import Sample
from ..signature.modules import CallFn, run_model


@dataclass(frozen=True)
class CheckReport:
    """What the check found over every check prompt."""

    prompts: int
    tokens_equal: bool
    max_abs_diff: float
    top1: float
    """Share of generated positions whose tuned top-1 token is eager's."""
    error: float | None
    """The budget metric's worst error (None when no budget)."""
    problem: str
    """Why the model is refused ("" when it passes)."""

    @property
    def ok(self) -> bool:
        """Whether the model passed."""
        return not self.problem


def prompt_of(sample: Sample) -> dict[str, torch.Tensor] | None:
    """The ``input_ids`` and ``attention_mask`` of a ``generate`` call's sample, or None."""
    ids = sample.kwargs.get("input_ids", sample.args[0] if sample.args else None)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        return None
    mask = sample.kwargs.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": mask}


def probes(samples: Sequence[Sample], vocab: int, room: int, seed: int = 0) -> list[Sample]:
    """Held-out prompts of batch sizes and lengths the samples do not have (one left-padded).

    A longer batch one past the largest batch (at most ``room`` positions long), and a
    2-token prompt of one row.
    """
    prompts = [p for s in samples if (p := prompt_of(s)) is not None]
    batch = max(p["input_ids"].shape[0] for p in prompts) + 1
    length = min(2 * max(p["input_ids"].shape[1] for p in prompts) + 3, max(room, 2))
    g = torch.Generator().manual_seed(seed)
    found = []
    for b, n in ((batch, length), (1, 2)):
        ids = torch.randint(0, vocab, (b, n), generator=g)
        mask = torch.ones(b, n, dtype=torch.long)
        if b > 1 and n > 2:
            mask[-1, : n // 3] = 0
        found.append(Sample((), {"input_ids": ids, "attention_mask": mask}))
    return found


def teacher_forced(
    model: Any, prompt: dict[str, torch.Tensor], tokens: torch.Tensor
) -> torch.Tensor:
    """``model``'s logits over the prompt and then ``tokens`` (``[batch, new]``), step by step.

    Returns ``[batch, prompt + new - 1, vocab]``: the prefill's logits, then each step's.
    """
    from transformers.cache_utils import DynamicCache

    parameters = inspect.signature(type(model).forward).parameters
    cache_name = "cache" if "cache" in parameters else "past_key_values"
    cache = DynamicCache(config=model.config)
    mask = prompt["attention_mask"]
    extra: dict[str, Any] = {}
    if "position_ids" in parameters:  # as generate passes them: left padding shifts rows
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        extra["position_ids"] = positions
    with torch.no_grad():
        out = model(
            input_ids=prompt["input_ids"], attention_mask=mask, use_cache=True,
            **{cache_name: cache}, **extra,
        )  # fmt: skip
        logits = [out.logits]
        cache = getattr(out, cache_name, None) or cache
        for step in range(tokens.shape[1] - 1):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            if extra:
                extra["position_ids"] = extra["position_ids"][:, -1:] + 1
            out = model(
                input_ids=tokens[:, step : step + 1], attention_mask=mask, use_cache=True,
                **{cache_name: cache}, **extra,
            )  # fmt: skip
            logits.append(out.logits)
            cache = getattr(out, cache_name, None) or cache
    return torch.cat(logits, dim=1)


class EagerReferences:
    """Eager's side of :func:`check` (its tokens and teacher-forced logits) per check prompt.

    Computed on first use and kept, so that several configs checked on the same prompts run
    eager once: on a CPU eager's ``generate`` is the slowest part of a check.
    """

    def __init__(self, eager: Any, call: CallFn | None) -> None:
        self.eager, self.call = eager, call
        self._found: dict[int, tuple[Sample, torch.Tensor | None, torch.Tensor | None]] = {}

    def get(
        self, sample: Sample, prompt: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Eager's token ids for ``sample`` and its logits teacher-forced on its new tokens."""
        kept = self._found.get(id(sample))
        if kept is not None and kept[0] is sample:
            return kept[1], kept[2]
        with torch.no_grad():
            ref = _sequences(run_model(self.eager, sample, self.call))
        logits = None
        if ref is not None and ref.shape[1] > prompt["input_ids"].shape[1]:
            logits = teacher_forced(self.eager, prompt, ref[:, prompt["input_ids"].shape[1] :])
        self._found[id(sample)] = (sample, ref, logits)
        return ref, logits


def check(
    eager: Any,
    tuned: Any,
    samples: Sequence[Sample],
    call: CallFn | None,
    *,
    tolerances: Tolerances | None = None,
    metric: Metric | None = None,
    max_error: float | None = None,
    references: EagerReferences | None = None,
) -> CheckReport:
    """Compare ``tuned`` with ``eager`` on ``samples`` (see the module's docstring).

    Without ``metric``: tokens must be equal and logits within ``tolerances``. With
    ``metric`` and ``max_error``: the teacher-forced logits' error must stay within it.
    ``references`` (of ``eager`` and ``call``) keeps eager's side between checks.
    """
    references = references or EagerReferences(eager, call)
    tokens_equal, worst, agree, total, error = True, 0.0, 0, 0, 0.0
    problem = ""
    for sample in samples:
        prompt = prompt_of(sample)
        if prompt is None:
            return CheckReport(0, False, math.inf, 0.0, None, "a prompt has no input_ids matrix")
        ref, reference = references.get(sample, prompt)
        with torch.no_grad():
            out = _sequences(run_model(tuned, sample, call))
        if ref is None or out is None:
            return CheckReport(0, False, math.inf, 0.0, None, "generate returned no token ids")
        if ref.shape != out.shape or not torch.equal(ref, out):
            tokens_equal = False
        start = prompt["input_ids"].shape[1]
        new = ref[:, start:]
        if new.shape[1] == 0 or reference is None:
            continue
        candidate = teacher_forced(tuned, prompt, new)
        rows = prompt["attention_mask"].sum(dim=1) > 0
        picks = candidate[:, start - 1 :].argmax(dim=-1)[rows]
        agree += int((picks == new[rows]).sum())
        total += int(new[rows].numel())
        if metric is not None:
            error = max(error, call_error(reference, candidate, metric))
        else:
            verdict = compare(reference, candidate, tolerances)
            worst = max(worst, verdict.max_abs_diff)
            if not verdict.ok and not problem:
                problem = f"teacher-forced logits: {verdict.reason}"
    if metric is None and not tokens_equal and not problem:
        problem = "generated tokens differ from eager's"
    if metric is not None and max_error is not None and error > max_error:
        problem = f"teacher-forced error {error:.3g} is over the budget's {max_error:g}"
    return CheckReport(
        len(samples),
        tokens_equal,
        worst,
        agree / total if total else 1.0,
        error if metric is not None else None,
        problem,
    )


def _sequences(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    value = getattr(output, "sequences", None)
    return value if isinstance(value, torch.Tensor) else None
