"""Dynamic dimensions: inference across recorded calls, declared Dims, resizing and probes."""

from __future__ import annotations

import pytest
import torch

from tunetree.errors import InvalidInputError
from tunetree.signature.graph import Dim, GraphKey, Sample, TensorSpec
from tunetree.signature.shapes import (
    declared_axes,
    group_graphs,
    keep_links,
    linked_dims,
    probe_sizes,
    ranged_key,
    rebatch,
    resize,
    sizes_of,
    value_probes,
)


def bert_call(b: int, n: int) -> Sample:
    return Sample(
        (),
        {
            "input_ids": torch.randint(0, 30000, (b, n)),
            "attention_mask": torch.ones(b, n, dtype=torch.long),
        },
    )


ISSUE_SHAPES = list(zip([1, 4, 8, 2, 16], [17, 64, 128, 200, 33], strict=True))


def test_varying_axes_become_shared_named_dims() -> None:
    samples = [bert_call(b, n) for b, n in ISSUE_SHAPES]
    key = ranged_key([s.key for s in samples])
    batch, seq = Dim("batch", 1, 16), Dim("seq", 17, 200)
    for spec in key.tensor_specs():
        assert spec.shape == (batch, seq)
    assert (
        str(key)
        == "(attention_mask=i64[batch 1..16, seq 17..200], input_ids=i64[batch 1..16, seq 17..200])"
    )
    assert key.is_dynamic and not samples[0].key.is_dynamic


def test_axes_that_vary_differently_get_different_names() -> None:
    calls = [Sample((torch.zeros(b, 3, n),)) for b, n in [(1, 5), (2, 5), (2, 9)]]
    key = ranged_key([c.key for c in calls])
    (spec,) = key.tensor_specs()
    assert spec.shape == (Dim("batch", 1, 2), 3, Dim("dim", 5, 9))


def test_fixed_axes_stay_fixed_and_single_call_is_exact() -> None:
    call = bert_call(8, 128)
    assert ranged_key([call.key]) == call.key


def test_accepts_inside_ranges_with_consistent_names() -> None:
    key = ranged_key([bert_call(b, n).key for b, n in ISSUE_SHAPES])
    assert key.accepts(bert_call(5, 77).key)
    assert key.accepts(bert_call(16, 200).key)
    assert not key.accepts(bert_call(17, 77).key)  # batch above its range
    assert not key.accepts(bert_call(5, 16).key)  # seq below its range
    mismatched = Sample(
        (),
        {
            "input_ids": torch.zeros(5, 77, dtype=torch.long),
            "attention_mask": torch.ones(5, 78, dtype=torch.long),
        },
    )
    assert not key.accepts(mismatched.key)  # one name, two sizes in one call
    assert key.pattern() == bert_call(3, 3).key.pattern()


def test_covers_narrower_ranges_and_exact_keys_only() -> None:
    wide = ranged_key([bert_call(b, n).key for b, n in [(1, 16), (32, 256)]])
    narrow = ranged_key([bert_call(b, n).key for b, n in [(2, 17), (8, 200)]])
    assert wide.covers(narrow) and not narrow.covers(wide)
    assert wide.covers(wide)
    assert wide.covers(bert_call(5, 77).key)  # one exact shape inside
    assert not wide.covers(bert_call(33, 77).key)  # batch beyond the range
    assert not wide.covers(ranged_key([bert_call(b, 64).key for b in (1, 64)]))
    # one name of ours cannot take two independent sizes of theirs
    independent = GraphKey(
        (),
        (
            ("attention_mask", TensorSpec("i64", (Dim("b", 1, 8), Dim("n", 16, 32)))),
            ("input_ids", TensorSpec("i64", (Dim("b2", 1, 8), Dim("n", 16, 32)))),
        ),
    )
    assert not wide.covers(independent)
    # another structure or dtype is never covered
    floats = Sample((), {"input_ids": torch.zeros(4, 20), "attention_mask": torch.ones(4, 20)})
    assert not wide.covers(floats.key)


def test_group_graphs_dynamic_and_exact() -> None:
    calls = [(bert_call(b, n), None) for b, n in ISSUE_SHAPES]
    assert len(group_graphs(calls, dynamic=True)) == 1
    assert len(group_graphs(calls, dynamic=False)) == 5
    other = [(Sample((torch.zeros(2, 3),)), None), (Sample((torch.zeros(2, 3, 4),)), None)]
    assert len(group_graphs(other, dynamic=True)) == 2  # different ranks: different graphs


def test_declared_dims_by_name_index_and_reference() -> None:
    sample = bert_call(8, 128)
    spec = {
        "input_ids": {0: Dim("batch", 1, 64), 1: Dim("seq", 1, 512)},
        "attention_mask": {0: "batch", 1: "seq"},
    }
    axes = declared_axes(spec, sample)
    key = ranged_key([sample.key], axes)
    for leaf in key.tensor_specs():
        assert leaf.shape == (Dim("batch", 1, 64), Dim("seq", 1, 512))
    positional = Sample((torch.zeros(8, 16),))
    axes = declared_axes(({0: Dim("b", 1, 32)},), positional)
    assert ranged_key([positional.key], axes).tensor_specs()[0].shape == (Dim("b", 1, 32), 16)
    axes = declared_axes({"x": {0: Dim("b", 1, 32)}}, positional, parameters=["x"])
    assert ranged_key([positional.key], axes).tensor_specs()[0].shape == (Dim("b", 1, 32), 16)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"nope": {0: Dim("b", 1, 4)}}, "does not have"),
        ({"input_ids": {0: "b"}}, "no tt.Dim declares"),
        ({"input_ids": {0: Dim("b", 1, 4)}}, "outside"),  # recorded batch 8 > 4
        ("batch", "dict/tuple"),
    ],
)
def test_declared_dims_refused_clearly(spec: object, message: str) -> None:
    sample = bert_call(8, 128)
    with pytest.raises(InvalidInputError, match=message):
        ranged_key([sample.key], declared_axes(spec, sample))


def test_dim_validates_its_bounds() -> None:
    with pytest.raises(InvalidInputError):
        Dim("b", 0, 4)
    with pytest.raises(InvalidInputError):
        Dim("b", 5, 4)
    with pytest.raises(InvalidInputError):
        Dim("not a name", 1, 4)


def test_json_round_trip_keeps_ranges_and_refuses_bad_ranges() -> None:
    key = ranged_key([bert_call(b, n).key for b, n in ISSUE_SHAPES])
    assert GraphKey.from_json(key.to_json()) == key
    data = key.to_json()
    data["kwargs"][0][1]["shape"][0] = {"dim": "batch", "min": 9, "max": 2}
    with pytest.raises(ValueError):
        GraphKey.from_json(data)
    data["kwargs"][0][1]["shape"][0] = 2**40
    with pytest.raises(ValueError):
        GraphKey.from_json(data)


def test_resize_slices_and_tiles_keeping_real_values() -> None:
    samples = [bert_call(b, n) for b, n in ISSUE_SHAPES]
    key = ranged_key([s.key for s in samples])
    base = samples[2]  # 8 x 128
    small = resize(base, key, {"batch": 1, "seq": 17})
    large = resize(base, key, {"batch": 16, "seq": 200})
    assert sizes_of(small, key) == {"batch": 1, "seq": 17}
    assert sizes_of(large, key) == {"batch": 16, "seq": 200}
    ids = base.kwargs["input_ids"]
    assert torch.equal(small.kwargs["input_ids"], ids[:1, :17])
    assert set(large.kwargs["input_ids"].unique().tolist()) <= set(ids.unique().tolist())
    assert bool((large.kwargs["attention_mask"] == 1).all())
    assert key.accepts(small.key) and key.accepts(large.key)


def test_probe_sizes_cover_ends_and_an_odd_size() -> None:
    key = ranged_key([bert_call(b, n).key for b, n in ISSUE_SHAPES])
    probes = probe_sizes(key)
    assert {"batch": 1, "seq": 17} in probes and {"batch": 16, "seq": 200} in probes
    middle = probes[2]
    assert 1 < middle["batch"] < 16 and 17 < middle["seq"] < 200
    assert middle["batch"] % 2 == 1 and middle["seq"] % 2 == 1
    assert probe_sizes(bert_call(2, 2).key) == []


def decode_step(cache: int) -> Sample:
    """A decode step's inputs: one new token, a cache of ``cache`` and a mask one longer."""
    return Sample((torch.zeros(1, 1), torch.zeros(1, 4, cache, 8), torch.ones(1, cache + 1)))


def test_probes_keep_a_mask_one_longer_than_the_cache() -> None:
    samples = [decode_step(n) for n in (8, 9, 10, 20)]
    key = ranged_key([s.key for s in samples])
    linked = linked_dims(samples, key)
    ((follower, (base, offset)),) = linked.items()
    assert offset in (1, -1) and {follower, base} == set(key.dims())
    for sizes in keep_links(probe_sizes(key), key, linked):
        assert sizes[follower] == sizes[base] + offset
    # two calls are no evidence: any two sizes that vary are one offset apart there
    assert linked_dims(samples[:2], ranged_key([s.key for s in samples[:2]])) == {}


def test_rebatch_slices_and_repeats_the_batch_axis() -> None:
    x = torch.randn(4, 3)
    out = rebatch([x], [1, 4, 10])
    assert [s.args[0].shape[0] for s in out] == [1, 4, 10]
    assert torch.equal(out[2].args[0][4:8], x)
    mixed = rebatch([{"ids": torch.zeros(4, 7, dtype=torch.long), "scale": torch.ones(1)}], [2])
    assert mixed[0].kwargs["ids"].shape == (2, 7) and mixed[0].kwargs["scale"].shape == (1,)
    with pytest.raises(InvalidInputError):
        rebatch([x], [0])


def test_value_probes_change_float_values_only() -> None:
    sample = Sample((torch.randn(4, 3), torch.arange(4)))
    probes = value_probes(sample)
    assert len(probes) == 2
    assert torch.equal(probes[0].args[0], -sample.args[0])
    assert torch.equal(probes[1].args[1], sample.args[1])
    assert not torch.equal(probes[1].args[0], sample.args[0])
    assert value_probes(Sample((torch.arange(3),))) == []
