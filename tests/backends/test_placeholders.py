"""Placeholder calls rebuilt from a graph key (what a loaded device graph captures from)."""

from __future__ import annotations

import pytest
import torch

from tunetree.backends.placeholders import sample_from_key
from tunetree.errors import BackendError
from tunetree.signature.graph import GraphKey, Sample


def test_sample_from_key_round_trip() -> None:
    sample = Sample(
        (torch.randn(2, 3), torch.randint(0, 9, (2, 5))),
        {
            "mask": torch.ones(2, 5, dtype=torch.bool),
            "pair": (torch.randn(4, dtype=torch.float16), [torch.zeros(1, dtype=torch.int32)]),
            "extra": {"scale": 0.5, "name": "x", "none": None},
            "dtype": torch.bfloat16,
            "flag": True,
        },
    )
    rebuilt = sample_from_key(sample.key, "cpu")
    assert rebuilt.key == sample.key
    assert torch.equal(rebuilt.args[0], torch.ones(2, 3))
    assert torch.equal(rebuilt.args[1], torch.zeros(2, 5, dtype=torch.int64))
    assert not rebuilt.kwargs["mask"].any()
    assert rebuilt.kwargs["dtype"] is torch.bfloat16 and rebuilt.kwargs["flag"] is True


def test_sample_from_key_refuses_opaque_objects() -> None:
    class Opaque:
        pass

    key = GraphKey.of((torch.randn(2), Opaque()), {})
    with pytest.raises(BackendError, match="Opaque"):
        sample_from_key(key, "cpu")
