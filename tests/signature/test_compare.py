from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tunetree.signature.compare import Tolerances, compare, compare_all


def test_equal_nested_outputs_match() -> None:
    a = {"x": torch.ones(3), "y": (torch.zeros(2), 3)}
    assert compare(a, {"x": torch.ones(3), "y": (torch.zeros(2), 3)}).ok


def test_float32_within_and_beyond_tolerance() -> None:
    ref = torch.ones(100)
    assert compare(ref, ref + 5e-4).ok  # rtol 1e-3
    bad = compare(ref, ref + 1e-2)
    assert not bad.ok
    assert "max abs diff 0.01" in bad.reason
    assert math.isclose(bad.max_abs_diff, 1e-2, rel_tol=1e-3)


def test_structure_dtype_shape_and_values_checked() -> None:
    assert not compare((torch.ones(2),), [torch.ones(2)]).ok
    assert not compare(torch.ones(2), torch.ones(2, dtype=torch.float64)).ok
    assert not compare(torch.ones(2), torch.ones(3)).ok
    assert not compare(torch.ones(2, dtype=torch.long), torch.tensor([1, 2])).ok
    assert not compare((torch.ones(1), 1), (torch.ones(1), 2)).ok


def test_nan_must_match_position() -> None:
    ref = torch.tensor([1.0, float("nan")])
    assert compare(ref, ref.clone()).ok
    assert not compare(ref, torch.tensor([float("nan"), 1.0])).ok


def test_dataclass_outputs_and_uniform_tolerance() -> None:
    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor

    ref = [Out(torch.ones(4))]
    cand = [Out(torch.ones(4) * 1.01)]
    assert not compare_all(ref, cand).ok
    assert compare_all(ref, cand, Tolerances.uniform(atol=0.05, rtol=0.0)).ok


def test_bf16_tolerance_is_looser_than_f32() -> None:
    t = Tolerances()
    assert t.for_dtype(torch.bfloat16).rtol > t.for_dtype(torch.float32).rtol


def test_a_structure_difference_is_named_by_where_it_is_in_one_line() -> None:
    """A whole output spec with a cache object ran to a screen of text in a table's status."""
    reference = {"hidden": torch.ones(2), "cache": [(torch.ones(1), torch.ones(1))] * 20}
    candidate = {"hidden": torch.ones(2), "cache": [(torch.ones(1), torch.ones(1))] * 19 + [()]}
    reason = compare(reference, candidate).reason
    assert reason.startswith("output structure differs at output.cache[19]: tuple")
    assert "vs eager tuple" in reason and len(reason) < 200 and "\n" not in reason


def test_large_outputs_are_compared_chunk_by_chunk_with_the_same_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The float64 temporaries are bounded by comparing in chunks (a prefill's logits over a
    large vocabulary are gigabytes in float64); NaNs, infinities and the largest difference are
    judged across chunk boundaries exactly as over the whole tensor."""
    from tunetree.signature import compare as compare_module

    ref = torch.linspace(-3, 3, 50)
    ref[5], ref[33] = math.nan, math.inf
    near = ref.clone()
    near[41] += 1e-7
    far = near.clone()
    far[47] += 0.5
    whole = [compare(ref, c) for c in (ref.clone(), near, far)]
    monkeypatch.setattr(compare_module, "_CHUNK", 7)
    chunked = [compare(ref, c) for c in (ref.clone(), near, far)]
    assert [c.ok for c in chunked] == [c.ok for c in whole] == [True, True, False]
    assert [c.max_abs_diff for c in chunked] == [c.max_abs_diff for c in whole]
    moved_nan = ref.clone()
    moved_nan[5], moved_nan[6] = 0.0, math.nan
    assert not compare(ref, moved_nan).ok


def test_a_structure_difference_past_a_long_context_shows_both_differing_parts() -> None:
    """The node's context was cut at 117 characters, before the part that differs, so both
    sides printed identically; the reason names the first differing item and both values."""
    names = [f"hidden_state_of_layer_{i:02d}" for i in range(30)]
    reference = {"out": {name: torch.ones(1) for name in names}}
    candidate = {"out": {name: torch.ones(1) for name in [*names[:-1], "hidden_state_extra"]}}
    reason = compare(reference, candidate).reason
    assert reason.startswith("output structure differs at output.out"), reason
    assert "'hidden_state_extra'" in reason and "'hidden_state_of_layer_29'" in reason, reason
    assert len(reason) < 300 and "\n" not in reason


def test_a_cache_layers_differing_constant_is_named_with_both_values() -> None:
    """Gemma2's prefill: the runner's sliding-window layer differed from eager's in one constant,
    and the reason printed the layer's class and data names twice, cut off before the
    constants, so both sides read the same."""
    cache_utils = pytest.importorskip("transformers.cache_utils")

    def layer(window: int) -> object:
        one = cache_utils.DynamicSlidingWindowLayer(sliding_window=window)
        one.update(torch.ones(1, 2, 8, 4), torch.ones(1, 2, 8, 4))
        one._sliding_window_tensor = torch.tensor(16)
        return one

    reference = {"logits": torch.ones(2), "cache": [layer(16), layer(16)]}
    candidate = {"logits": torch.ones(2), "cache": [layer(16), layer(32)]}
    reason = compare(reference, candidate).reason
    assert reason.startswith("output structure differs at output.cache[1]"), reason
    assert "DynamicSlidingWindowLayer" in reason and "sliding_window" in reason, reason
    assert "32 vs eager 16" in reason, reason
    assert len(reason) < 300 and "\n" not in reason


def test_a_long_differing_value_is_shown_around_where_it_differs() -> None:
    """Both sides' values are cut to a bound, around their first differing character."""
    cache_utils = pytest.importorskip("transformers.cache_utils")

    def layer(tag: str) -> object:
        one = cache_utils.DynamicSlidingWindowLayer(sliding_window=16)
        one.update(torch.ones(1, 2, 8, 4), torch.ones(1, 2, 8, 4))
        one.tag = "x" * 200 + tag + "y" * 200  # type: ignore[attr-defined]
        return one

    reason = compare([layer("EAGER")], [layer("OTHER")]).reason
    assert "constant tag:" in reason and "xOTHERy" in reason and "xEAGERy" in reason, reason
    assert len(reason) < 300, reason
