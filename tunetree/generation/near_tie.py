"""Greedy tokens judged against eager's, up to eager's own near-ties.

Two correct computations of the same bf16 model (another kernel for the same attention, a
fused norm that rounds once instead of twice) give logits that differ by about the dtype's
rounding; where eager's two most likely tokens are closer than that, greedy search may pick
either, and the sequences part there. A row whose tokens first differ from eager's at such a
position keeps results within the tolerance: eager's logit for the token the candidate chose
is within the dtype's tolerance of eager's largest logit at that position (eager's logits
recomputed on eager's own prefix). A row that parts anywhere else does not. Rows are judged
at their first difference only: after it they continue from other tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..signature.compare import DEFAULT_TOLERANCES, Tolerance


@dataclass(frozen=True)
class TokenVerdict:
    """How a candidate's greedy tokens compare with eager's."""

    equal: bool
    near_ties: int = 0
    """Rows that part from eager's at a near-tie (accepted)."""
    problem: str = ""
    """Why the tokens are refused ("" when accepted)."""


def judge_tokens(
    model: Any,
    got: torch.Tensor,
    want: torch.Tensor,
    prompt_mask: torch.Tensor,
    tolerance: Tolerance | None = None,
) -> TokenVerdict:
    """Accept tokens equal to eager's, or parting from them only at eager's near-ties.

    Args:
        model: The untuned model (eager's logits are recomputed with it).
        got: The candidate's output ids, prompt included.
        want: Eager's output ids for the same call.
        prompt_mask: The call's attention mask (prompt columns).
        tolerance: Near-tie width; by default the model's dtype's comparison tolerance.
    """
    if got.shape[0] != want.shape[0]:
        return TokenVerdict(False, problem=f"{got.shape[0]} rows against eager's {want.shape[0]}")
    if torch.equal(got, want):
        return TokenVerdict(True)
    dtype = next(model.parameters()).dtype
    tol = tolerance or DEFAULT_TOLERANCES.get(dtype, Tolerance(0.0, 0.0))
    prompt = prompt_mask.shape[1]
    width = min(got.shape[1], want.shape[1])
    ties = 0
    for row in range(got.shape[0]):
        differs = (got[row, :width] != want[row, :width]).nonzero()
        if differs.numel() == 0:
            if got.shape[1] != want.shape[1]:
                return TokenVerdict(False, problem="stopped at another length than eager")
            continue
        column = int(differs[0])
        if column < prompt:
            return TokenVerdict(False, problem=f"row {row}: the prompt was changed")
        gap = _gap(model, want[row : row + 1, :column], prompt_mask[row], int(got[row, column]))
        limit = tol.atol + tol.rtol * gap[1]
        if gap[0] > limit:
            return TokenVerdict(
                False,
                problem=f"row {row} parts from eager's tokens at position {column} where eager's "
                f"margin is {gap[0]:.3g} (near-tie limit {limit:.3g})",
            )
        ties += 1
    return TokenVerdict(False, near_ties=ties)


def _gap(model: Any, prefix: torch.Tensor, mask: torch.Tensor, chosen: int) -> tuple[float, float]:
    """Eager's largest logit minus its logit for ``chosen`` after ``prefix``, and the largest."""
    extra = prefix.shape[1] - mask.shape[0]
    full = torch.cat([mask.to(prefix.device), mask.new_ones(extra).to(prefix.device)])[None]
    positions = (full.cumsum(-1) - 1).masked_fill(full == 0, 0)  # as generate gives them
    with torch.no_grad():
        out = model(input_ids=prefix, attention_mask=full, position_ids=positions)
    logits = out.logits[0, -1].float()
    top = float(logits.max())
    return top - float(logits[chosen]), abs(top)
