from __future__ import annotations

import math

import pytest
import torch

from tunetree.accuracy import output_error
from tunetree.accuracy.metrics import call_error, leaf_error
from tunetree.errors import InvalidInputError


def test_rel_l2_is_the_relative_norm_of_the_difference() -> None:
    ref = torch.randn(64, 32)
    assert leaf_error(ref, ref * 1.01, "rel_l2") == pytest.approx(0.01, rel=1e-6)
    assert leaf_error(ref, ref.clone(), "rel_l2") == 0.0


def test_max_abs_and_cosine() -> None:
    ref = torch.zeros(4)
    cand = torch.tensor([0.0, 0.5, -2.0, 0.0])
    assert leaf_error(ref, cand, "max_abs") == 2.0
    x = torch.randn(100)
    assert leaf_error(x, 3 * x, "cosine") == pytest.approx(0.0, abs=1e-12)
    assert leaf_error(x, -x, "cosine") == pytest.approx(2.0)


def test_integer_leaves_shape_and_structure_must_match_exactly() -> None:
    ids = torch.tensor([1, 2, 3])
    assert leaf_error(ids, ids.clone(), "rel_l2") == 0.0
    assert leaf_error(ids, torch.tensor([1, 2, 4]), "rel_l2") == math.inf
    assert leaf_error(torch.ones(2, 3), torch.ones(3, 2), "rel_l2") == math.inf
    assert call_error((torch.ones(2),), [torch.ones(2)], "rel_l2") == math.inf
    assert call_error({"a": torch.ones(2), "n": 3}, {"a": torch.ones(2), "n": 4}, "rel_l2") == (
        math.inf
    )


def test_nan_must_sit_where_eager_has_it() -> None:
    ref = torch.tensor([1.0, float("nan"), 3.0])
    assert leaf_error(ref, torch.tensor([1.0, float("nan"), 3.0]), "rel_l2") == 0.0
    assert leaf_error(ref, torch.tensor([1.0, 2.0, 3.0]), "rel_l2") == math.inf
    assert leaf_error(torch.ones(3), torch.tensor([1.0, float("inf"), 1.0]), "max_abs") == math.inf


def test_the_worst_call_and_the_worst_leaf_decide() -> None:
    refs = [(torch.ones(8), torch.ones(8)), (torch.ones(8), torch.ones(8))]
    cands = [(torch.ones(8) * 1.001, torch.ones(8)), (torch.ones(8), torch.ones(8) * 1.02)]
    assert output_error(refs, cands, "rel_l2") == pytest.approx(0.02)


def test_a_callable_metric_sees_whole_outputs() -> None:
    def top1_disagreement(ref, cand):
        return float((ref.argmax(-1) != cand.argmax(-1)).float().mean())

    ref = torch.tensor([[1.0, 2.0], [3.0, 1.0]])
    cand = torch.tensor([[1.0, 2.0], [1.0, 3.0]])
    assert output_error([ref], [cand], top1_disagreement) == 0.5
    with pytest.raises(InvalidInputError, match="not a number"):
        output_error([ref], [cand], lambda r, c: "bad")
    with pytest.raises(InvalidInputError, match="candidate outputs"):
        output_error([ref, ref], [cand], "rel_l2")
