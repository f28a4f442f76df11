"""How far a candidate's outputs are from fp32 eager's: one number per metric.

Every metric is an *error* (0 when equal, larger is worse) computed in float64 leaf by leaf
over the flattened outputs; a call's error is its worst leaf's and a set of calls' error is its
worst call's, so a budget holds for every output of every call, not on average:

- ``rel_l2``: ``||candidate - eager||_2 / ||eager||_2`` (the plain L2 norm of the difference
  when eager's leaf is all zeros);
- ``max_abs``: the largest absolute difference;
- ``cosine``: ``1 - cos(candidate, eager)`` of the flattened leaf (0 for two zero leaves).

Leaves that are not floating point (token ids, masks, lengths) and non-tensor leaves must be
equal, as must the output structure and every shape: anything else is an infinite error. NaN
and infinities must sit where eager has them. A callable metric ``fn(eager_output,
candidate_output) -> float`` is called once per call with the whole outputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import InvalidInputError
from ..signature.graph import flatten

Metric = str | Callable[[Any, Any], float]
"""A metric's name (:data:`METRICS`) or ``fn(eager_output, candidate_output) -> float``."""


def _rel_l2(ref: torch.Tensor, cand: torch.Tensor) -> float:
    norm = float(torch.linalg.vector_norm(ref))
    diff = float(torch.linalg.vector_norm(cand - ref))
    return diff / norm if norm > 0 else diff


def _max_abs(ref: torch.Tensor, cand: torch.Tensor) -> float:
    return float((cand - ref).abs().max())


def _cosine(ref: torch.Tensor, cand: torch.Tensor) -> float:
    norms = float(torch.linalg.vector_norm(ref)) * float(torch.linalg.vector_norm(cand))
    if norms == 0:
        return 0.0 if bool(torch.equal(ref, cand)) else 1.0
    return max(0.0, 1.0 - float(torch.dot(ref.flatten(), cand.flatten())) / norms)


METRICS: dict[str, Callable[[torch.Tensor, torch.Tensor], float]] = {
    "rel_l2": _rel_l2,
    "max_abs": _max_abs,
    "cosine": _cosine,
}
"""The named metrics, each on two float64 tensors of one shape with finite values."""


def check_metric(metric: Any) -> None:
    """Refuse a metric that is neither a known name nor a callable."""
    if callable(metric):
        return
    if not isinstance(metric, str) or metric not in METRICS:
        raise InvalidInputError(
            f"metric must be one of {', '.join(METRICS)} or a callable(reference, candidate) -> "
            f"float, not {metric!r}"
        )


def metric_name(metric: str | Callable[..., Any]) -> str:
    """A metric (or an ``evaluate`` function) as reports show it: its name, or the callable's."""
    if isinstance(metric, str):
        return metric
    return getattr(metric, "__name__", type(metric).__name__)


def leaf_error(ref: torch.Tensor, cand: torch.Tensor, metric: str) -> float:
    """The named metric's error between two tensors (inf for a shape or non-float mismatch)."""
    if ref.shape != cand.shape:
        return math.inf
    if ref.numel() == 0:
        return 0.0
    cand = cand.to(ref.device)
    if not (ref.is_floating_point() or ref.is_complex()):
        return 0.0 if bool(torch.equal(ref, cand.to(ref.dtype))) else math.inf
    ref64, cand64 = ref.double(), cand.double()
    special = ~torch.isfinite(ref64)
    if bool(special.any()):
        same = torch.equal(torch.isnan(ref64), torch.isnan(cand64)) and torch.equal(
            torch.where(torch.isnan(ref64), 0.0, ref64)[special],
            torch.where(torch.isnan(cand64), 0.0, cand64)[special],
        )
        if not same:
            return math.inf
        ref64, cand64 = torch.where(special, 0.0, ref64), torch.where(special, 0.0, cand64)
    if not bool(torch.isfinite(cand64).all()):
        return math.inf
    return METRICS[metric](ref64, cand64)


def call_error(reference: Any, candidate: Any, metric: Metric) -> float:
    """One call's error: the worst leaf's, or the callable's value."""
    if not isinstance(metric, str):
        value = metric(reference, candidate)
        try:
            error = float(value)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"the accuracy metric {metric_name(metric)} returned {value!r}, not a number"
            ) from exc
        return error if not math.isnan(error) else math.inf
    ref_leaves, ref_spec = flatten(reference)
    cand_leaves, cand_spec = flatten(candidate)
    if ref_spec != cand_spec:
        return math.inf
    worst = 0.0
    for ref, cand in zip(ref_leaves, cand_leaves, strict=True):
        if isinstance(ref, torch.Tensor) and isinstance(cand, torch.Tensor):
            worst = max(worst, leaf_error(ref, cand, metric))
        elif (
            isinstance(ref, torch.Tensor)
            or isinstance(cand, torch.Tensor)
            or (ref is not cand and ref != cand)
        ):
            return math.inf
    return worst


def output_error(references: Sequence[Any], candidates: Sequence[Any], metric: Metric) -> float:
    """The worst call's error over paired outputs (0.0 for no calls)."""
    if len(references) != len(candidates):
        raise InvalidInputError(
            f"{len(candidates)} candidate outputs for {len(references)} reference outputs"
        )
    return max(
        (call_error(r, c, metric) for r, c in zip(references, candidates, strict=True)), default=0.0
    )
