"""Greedy tokens parting from eager's are accepted only at eager's own near-ties."""

from __future__ import annotations

import torch

from tests.generation.test_multistep import eager, prompt, qwen3
from tunetree.generation.near_tie import judge_tokens
from tunetree.signature.compare import Tolerance


def runner_up(model, prefix: torch.Tensor, mask: torch.Tensor) -> tuple[int, float]:
    """Eager's second most likely token after ``prefix`` and its margin to the first."""
    full = torch.cat([mask, mask.new_ones(prefix.shape[1] - mask.shape[0])])[None]
    positions = (full.cumsum(-1) - 1).masked_fill(full == 0, 0)
    with torch.no_grad():
        logits = model(input_ids=prefix, attention_mask=full, position_ids=positions).logits
    top = logits[0, -1].float().topk(2)
    return int(top.indices[1]), float(top.values[0] - top.values[1])


def test_equal_tokens_pass_and_a_part_at_a_non_tie_is_refused_with_where() -> None:
    model = qwen3()
    inputs = prompt(2, 7, 3)
    want = eager(model, inputs, max_new_tokens=6)
    assert judge_tokens(model, want.clone(), want, inputs["attention_mask"]).equal
    column = 7 + 2
    second, margin = runner_up(model, want[1:2, :column], inputs["attention_mask"][1])
    got = want.clone()
    got[1, column] = second
    verdict = judge_tokens(model, got, want, inputs["attention_mask"])
    assert not verdict.equal
    assert "row 1 parts from eager's tokens at position 9" in verdict.problem
    wide = Tolerance(atol=margin * 1.01, rtol=0.0)  # this margin is a near-tie at that width
    accepted = judge_tokens(model, got, want, inputs["attention_mask"], wide)
    assert accepted.problem == "" and accepted.near_ties == 1


def test_a_changed_prompt_or_another_length_is_refused() -> None:
    model = qwen3()
    inputs = prompt(1, 5, 4)
    want = eager(model, inputs, max_new_tokens=4)
    got = want.clone()
    got[0, 2] += 1
    assert "prompt was changed" in judge_tokens(model, got, want, inputs["attention_mask"]).problem
    shorter = want[:, :-1]
    verdict = judge_tokens(model, shorter, want, inputs["attention_mask"])
    assert verdict.problem == "stopped at another length than eager"
