"""The corners a declared envelope is probed at, and the calls resized to reach them."""

from __future__ import annotations

import torch

from tunetree.signature.envelope import call_bases, corners
from tunetree.signature.graph import Dim, Sample
from tunetree.signature.shapes import ranged_key


def prompt(batch: int, length: int, padded: bool) -> Sample:
    mask = torch.ones(batch, length, dtype=torch.long)
    if padded:
        mask[-1, 0] = 0
    return Sample(
        (), {"input_ids": torch.ones(batch, length, dtype=torch.long), "attention_mask": mask}
    )


def test_each_dimension_is_probed_at_its_minimum_with_the_others_at_their_maximum() -> None:
    batch, length = Dim("batch", 1, 6), Dim("prompt", 1, 40)
    calls = [prompt(2, 8, True), prompt(2, 12, True)]
    declared = {(0, 0): batch, (0, 1): length, (1, 0): batch, (1, 1): length}
    sizes = corners(ranged_key([c.key for c in calls], declared))
    assert {"batch": 1, "prompt": 1} in sizes and {"batch": 6, "prompt": 40} in sizes
    # the shortest prompts at the largest batch, and 2 beside 1 (a size of 1 keys apart)
    assert {"batch": 6, "prompt": 1} in sizes and {"batch": 6, "prompt": 2} in sizes
    assert {"batch": 1, "prompt": 40} in sizes and {"batch": 2, "prompt": 40} in sizes
    assert len(sizes) == len({tuple(sorted(s.items())) for s in sizes})  # no repeats


def test_the_largest_item_of_each_kind_of_root_call_is_resized() -> None:
    """An unpadded prompt reaches the model without a mask: it is resized too, not only the
    largest (padded) prompt."""
    items = [prompt(2, 8, True), prompt(2, 12, True), prompt(1, 10, False)]
    masked, unmasked = Sample((torch.ones(2, 8),), {}), Sample((torch.ones(1, 10),), {"m": None})
    root_calls = [masked, masked, unmasked]  # the forward's calls, by dataset item
    bases = call_bases(items, root_calls, [0, 1, 2])
    assert len(bases) == 2 and bases[0] is items[1] and bases[1] is items[2]  # 2x12, 1x10
