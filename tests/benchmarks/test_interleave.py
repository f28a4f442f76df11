"""The benchmarks' round orders: no approach always runs right after the same other one."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.common.interleave import rotations


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_every_approach_follows_every_other_equally_often(n: int) -> None:
    names = [f"approach{i}" for i in range(n)]
    cycle = 2 * n  # a whole Williams design for odd and even n
    rounds = rotations(names, 2 * cycle)
    assert all(sorted(order) == names for order in rounds)
    follows = Counter((o[i], o[i + 1]) for o in rounds for i in range(n - 1))
    assert len(follows) == n * (n - 1)  # every ordered pair occurs
    assert len(set(follows.values())) == 1  # and equally often
    starts = Counter(order[0] for order in rounds)
    assert len(starts) == n and len(set(starts.values())) == 1


def test_a_single_approach_has_one_order() -> None:
    assert rotations(["only"], 3) == [["only"]] * 3
