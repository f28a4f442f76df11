"""The whole-model stateful runner serves generate as users call it, with eager's tokens."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("openvino")

import tunetree as tt  # noqa: E402
from tunetree.candidates.measure import Timing  # noqa: E402
from tunetree.generation.choosing import UNTUNED  # noqa: E402
from tunetree.generation.stateful import StatefulConfig, stateful_model  # noqa: E402
from tunetree.generation.stateful_trial import try_stateful  # noqa: E402
from tunetree.signature.graph import Sample  # noqa: E402

GEN = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
SMALL = dict(
    vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
)  # fmt: skip


def _model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(**SMALL)
    elif family == "qwen2":
        config = transformers.Qwen2Config(**SMALL)
    else:
        config = transformers.MistralConfig(**SMALL, sliding_window=64)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _prompt(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, : length // 3] = 0  # a left-padded row
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def served(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, torch.nn.Module]:
    model = _model(request.param)
    return model, stateful_model(model)


def test_unseen_prompts_and_batches_generate_eagers_tokens_without_the_original_forward(
    served: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    model, tuned = served
    before = tuned.forward.counts.original
    for batch, length in [(1, 2), (3, 41), (5, 17), (2, 57)]:
        prompt = _prompt(batch, length, seed=batch * length)
        assert torch.equal(tuned.generate(**prompt, **GEN), model.generate(**prompt, **GEN))
    assert tuned.forward.counts.original == before
    assert tuned.forward is not model.forward  # the model given in is untouched
    assert "forward" not in model.__dict__


def test_a_prefill_projects_only_the_positions_whose_logits_are_kept(
    served: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    """generate asks for the last position's logits (logits_to_keep=1): the runtime itself
    returns that row only, with eager's values, and all rows when every logit is asked for."""
    model, tuned = served
    prompt = _prompt(3, 23, seed=5)
    runner = tuned.forward.runner
    for keep in (1, 4, 0, 40):
        with torch.no_grad():
            expected = model(**prompt, logits_to_keep=keep).logits
            got = tuned(**prompt, logits_to_keep=keep).logits
            runner.reset()
            raw = runner.run(
                prompt["input_ids"],
                prompt["attention_mask"],
                (prompt["attention_mask"].cumsum(-1) - 1).clamp(min=0),
                keep,
            )
        rows = 23 if keep in (0, 40) else keep
        assert got.shape == expected.shape == raw.shape == (3, rows, 500)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    runner.reset()


def test_returned_cache_holds_eagers_state_and_generation_continues_from_it(
    served: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    model, tuned = served
    prompt = _prompt(2, 9, seed=3)
    ref = model.generate(**prompt, **GEN, return_dict_in_generate=True)
    out = tuned.generate(**prompt, **GEN, return_dict_in_generate=True)
    # another generate resets the runtime's state: the returned cache must keep its own
    tuned.generate(**_prompt(1, 5, seed=4), **GEN)
    ref_cache, cache = ref.past_key_values, out.past_key_values
    assert cache.get_seq_length() == ref_cache.get_seq_length()
    for a, b in zip(ref_cache.layers, cache.layers, strict=True):
        torch.testing.assert_close(b.keys, a.keys, atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(b.values, a.values, atol=1e-4, rtol=1e-3)
    more = torch.randint(3, 500, (2, 3), generator=torch.Generator().manual_seed(5))
    ids = torch.cat([ref.sequences, more], dim=1)
    mask = torch.cat([prompt["attention_mask"], torch.ones(2, ids.shape[1] - 9)], dim=1).long()
    expected = model.generate(input_ids=ids, attention_mask=mask, past_key_values=ref_cache, **GEN)
    got = tuned.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, **GEN)
    assert torch.equal(got, expected)


def test_beam_search_keeps_eagers_tokens(served: tuple[torch.nn.Module, torch.nn.Module]) -> None:
    model, tuned = served
    prompt = _prompt(1, 7, seed=8)
    beams = dict(GEN, num_beams=2)
    assert torch.equal(tuned.generate(**prompt, **beams), model.generate(**prompt, **beams))


def test_a_call_it_cannot_answer_runs_the_original_forward_with_its_reason(
    served: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    model, tuned = served
    ids = _prompt(1, 4)["input_ids"]
    before = tuned.forward.counts.original
    out = tuned(input_ids=ids, output_hidden_states=True)
    assert out.hidden_states is not None
    assert tuned.forward.counts.original == before + 1
    assert any("output_hidden_states" in r for r in tuned.forward.counts.reasons)
    too_long = torch.randint(3, 500, (1, 200))  # past the envelope (128 positions)
    torch.testing.assert_close(tuned(input_ids=too_long).logits, model(input_ids=too_long).logits)
    assert any("envelope" in r for r in tuned.forward.counts.reasons)


def _timings(models: dict) -> dict[str, Timing]:
    """A fake measurement: every tuned model twice as fast as the untuned one."""
    return {name: Timing(1.0 if name == UNTUNED else 0.5, 1.0, 1.0, 1.0, 3, 1) for name in models}


def test_a_config_the_budget_refuses_is_never_served() -> None:
    model = _model("llama")
    samples = [Sample((), _prompt(1, 6, 1)), Sample((), _prompt(2, 9, 2))]

    def call(m, **x):
        return m.generate(**x, **GEN)

    trials = try_stateful(
        model, samples, call, _timings, accuracy=tt.AccuracyBudget(max_error=1e-12)
    )
    labels = {t.config.label: t for t in trials}
    for weights in ("int8", "int4"):
        row = labels[StatefulConfig(weights=weights).label]
        assert row.status == "rejected" and "budget" in row.reason
        assert row.model is None
        assert row.report is not None and row.report.error is not None and row.report.error > 0
        assert not math.isnan(row.report.top1)
    chosen = [t for t in trials if t.chosen]
    assert [t.config.preserves_results for t in chosen] == [True]


def test_a_budget_admits_a_changing_config_labelled_as_such() -> None:
    model = _model("llama")
    samples = [Sample((), _prompt(1, 6, 1)), Sample((), _prompt(2, 9, 2))]

    def call(m, **x):
        return m.generate(**x, **GEN)

    def faster_int8(models: dict) -> dict[str, Timing]:
        timings = _timings(models)
        for name in models:
            if "int8" in name:
                timings[name] = Timing(0.1, 0.1, 0.1, 0.1, 3, 1)
        return timings

    trials = try_stateful(
        model, samples, call, faster_int8, accuracy=tt.AccuracyBudget(max_error=0.5)
    )
    chosen = next(t for t in trials if t.chosen)
    assert not chosen.config.preserves_results
    assert "CHANGES RESULTS" in chosen.cells()
    assert chosen.report is not None and chosen.report.error is not None
    assert chosen.report.error <= 0.5
    prompt = _prompt(3, 20, seed=9)
    out = chosen.model.generate(**prompt, **GEN)
    assert out.shape == (3, 26) and chosen.model.forward.counts.original == 0


def test_eager_generates_once_per_check_prompt_however_many_configs_are_checked() -> None:
    model = _model("llama")
    samples = [Sample((), _prompt(1, 6, 1)), Sample((), _prompt(2, 9, 2))]
    eager_calls = []

    def call(m, **x):
        if m is model:
            eager_calls.append(x["input_ids"].shape)
        return m.generate(**x, **GEN)

    trials = try_stateful(model, samples, call, _timings, accuracy=tt.AccuracyBudget(max_error=0.5))
    checked = [t for t in trials if t.report is not None]
    assert len(checked) >= 3  # f32, 8-bit and 4-bit weights at least
    # one call to learn how many tokens a call makes, then the two tuning prompts and the
    # two probes, each generated by eager once (not once per config)
    assert len(eager_calls) == 5 and len(set(eager_calls)) == 4
    assert all(t.report.prompts == 4 for t in checked)


@pytest.mark.slow
def test_auto_tune_serves_the_usual_generate_call_whole_before_any_depth() -> None:
    model = _model("llama")

    def call(m, **x):
        return m.generate(**x, **GEN)

    result = tt.auto_tune(
        model, [_prompt(1, 6, 1), _prompt(2, 9, 2)], call=call, verbose=False, cache=False
    )
    chosen = [t for t in result.stateful if t.chosen]
    assert [t.config.preserves_results for t in chosen] == [True]
    assert result.model.forward is not model.forward
    assert "whole model, stateful" in str(result)
    for batch, length in [(3, 40), (5, 17)]:
        prompt = _prompt(batch, length, seed=batch)
        assert torch.equal(result.model.generate(**prompt, **GEN), model.generate(**prompt, **GEN))
    assert result.model.forward.counts.original == 0


STATIC = dict(GEN, cache_implementation="static", disable_compile=True)


def test_a_static_cache_is_served_with_eagers_tokens_and_cache(
    served: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    model, tuned = served
    before = tuned.forward.counts.original
    for batch, length in [(1, 5), (3, 23)]:
        prompt = _prompt(batch, length, seed=7 * batch + length)
        with torch.no_grad():
            mine = tuned.generate(**prompt, **STATIC, return_dict_in_generate=True)
            eager = model.generate(**prompt, **STATIC, return_dict_in_generate=True)
        assert torch.equal(mine.sequences, eager.sequences)
        pairs = zip(mine.past_key_values.layers, eager.past_key_values.layers, strict=True)
        for got, expected in pairs:
            assert int(got.cumulative_length) == int(expected.cumulative_length)
            torch.testing.assert_close(got.keys, expected.keys, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got.values, expected.values, rtol=1e-4, atol=1e-4)
    # Mistral's layers slide, but inside the envelope (below the window) they hold every
    # position, and its 4-D mask is the causal one: served too.
    assert tuned.forward.counts.original == before


def test_an_ordinary_static_cache_of_sliding_layers_is_not_loaded() -> None:
    from tunetree.generation.static_mask import cache_lengths

    model = _model("mistral")
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        model(**_prompt(1, 5), past_key_values=cache)
    assert type(cache.layers[0]).__name__ == "StaticSlidingWindowLayer"
    assert cache_lengths(cache) == "a StaticSlidingWindowLayer cache layer is not served"
    full = transformers.StaticCache(config=_model("llama").config, max_cache_len=16)
    with torch.no_grad():
        _model("llama")(**_prompt(1, 5), past_key_values=full)
    assert cache_lengths(full) == {5}


def test_a_four_d_mask_is_served_only_as_the_causal_mask_of_its_padding() -> None:
    from tunetree.generation.static_mask import padding_of

    padding = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    causal = torch.ones(2, 5, dtype=torch.bool).tril(diagonal=3)  # 3 cached, 2 new positions
    mask = (padding.bool()[:, None, :] & causal)[:, None]
    capacity = torch.zeros(2, 1, 2, 3, dtype=torch.bool)  # keys past the input: never attended
    full = torch.cat([mask, capacity], dim=-1)
    assert torch.equal(padding_of(full, 2, 2, 3), padding)
    additive = torch.zeros(full.shape).masked_fill(~full, torch.finfo(torch.float32).min)
    assert torch.equal(padding_of(additive, 2, 2, 3), padding)
    custom = full.clone()
    custom[0, 0, 0, 1] = False  # a hole no padding explains
    assert (
        padding_of(custom, 2, 2, 3)
        == "the 4-D attention_mask is not the causal mask of its padding"
    )
    ahead = full.clone()
    ahead[0, 0, 0, 6] = True  # a key past the input
    assert "not the causal mask" in str(padding_of(ahead, 2, 2, 3))
    bias = additive.clone()
    bias[0, 0, 0, 0] = -1.0  # a bias, not a mask
    assert "other than 0" in str(padding_of(bias, 2, 2, 3))
    assert "fewer than" in str(padding_of(full[..., :4], 2, 2, 3))


def test_a_mask_per_layer_type_is_refused_with_its_reason_not_a_crash() -> None:
    from tunetree.generation.stateful_forward import _mask_and_positions

    mask = torch.ones(1, 1, 2, 4, dtype=torch.bool)
    both = {"full_attention": mask, "sliding_attention": mask}
    assert _mask_and_positions({"attention_mask": both}, 1, 2, 2) == (
        "an attention_mask per layer type (full_attention, sliding_attention)"
    )
    assert "of type list" in str(_mask_and_positions({"attention_mask": [mask]}, 1, 2, 2))


def test_configs_change_results_only_under_a_budget_smallest_change_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tunetree.generation import stateful_trial

    assert stateful_trial.configs(None) == [StatefulConfig()]
    budget = tt.AccuracyBudget(max_error=0.05)
    monkeypatch.setattr(stateful_trial, "bf16_reason", lambda: None)
    assert [c.label for c in stateful_trial.configs(budget)] == [
        "openvino-stateful f32",
        "openvino-stateful bf16",
        "openvino-stateful f32 int8-channel-weights",
        "openvino-stateful f32 int8-weights",
        "openvino-stateful bf16 int8-channel-weights",
        "openvino-stateful bf16 int8-weights",
        "openvino-stateful f32 int4-weights",
    ]
    monkeypatch.setattr(stateful_trial, "bf16_reason", lambda: "no bf16 units")
    assert [c.weights for c in stateful_trial.configs(budget)] == [
        None, "int8-channel", "int8", "int4"
    ]  # fmt: skip


def test_eight_bit_groups_are_built_only_where_per_channel_is_over_the_budget() -> None:
    from tunetree.generation.stateful_trial import StatefulTrial, superseded

    def trial(precision: str, weights: str | None, status: str = "pending") -> StatefulTrial:
        found = StatefulTrial(StatefulConfig(precision=precision, weights=weights))
        found.status = status
        return found

    groups_f32, groups_bf16 = trial("f32", "int8"), trial("bf16", "int8")
    trials = [
        trial("f32", "int8-channel", "passed"),
        groups_f32,
        trial("bf16", "int8-channel", "rejected"),
        groups_bf16,
        trial("f32", "int4"),
    ]
    assert superseded(groups_f32, trials) is not None  # per channel passed at f32
    assert superseded(groups_bf16, trials) is None  # over the budget at bf16: groups are tried
    assert all(superseded(t, trials) is None for t in trials if t.config.weights != "int8")


def test_only_a_results_changing_config_holds_its_cache_in_sixteen_bits() -> None:
    def cache(**config: str) -> str:
        return StatefulConfig(**config).compile_config()["KV_CACHE_PRECISION"]  # type: ignore[arg-type]

    assert cache() == "f32"  # the default: OpenVINO's own default (u8) would change results
    assert cache(weights="int8") == cache(weights="int4") == "f16"
    assert cache(precision="bf16") == cache(precision="bf16", weights="int8") == "bf16"


def test_eight_bits_per_channel_keep_f16_scales_as_nncf_writes_them_groups_f32() -> None:
    import numpy as np
    import openvino as ov
    from openvino import opset13

    from tunetree.generation.stateful import compressed

    weight = np.random.default_rng(0).standard_normal((96, 192)).astype(np.float32)
    x = opset13.parameter([2, 192], np.float32, name="x")
    model = ov.Model([opset13.matmul(x, opset13.constant(weight), False, True)], [x])

    def scales(weights: str | None) -> set[str]:
        return {
            op.get_element_type().get_type_name()
            for op in compressed(model, weights).get_ordered_ops()
            if op.get_type_name() == "Constant" and op.get_element_type().is_real()
        }

    assert scales("int8-channel") == {"f16"}
    assert scales("int8") == {"f32"}  # groups, chosen where the error is near the budget
    assert scales(None) == {"f32"} and compressed(model, None) is model


def test_the_runners_logits_are_its_own_not_the_requests_output_memory() -> None:
    twin = stateful_model(_model("llama"))
    runner = twin.__dict__["forward"].runner
    ids = _prompt(1, 5)["input_ids"]
    runner.reset()
    first = runner.run(ids, torch.ones_like(ids), torch.arange(5)[None], 1)
    kept = first.clone()
    second = runner.run(ids[:, :1], torch.ones(1, 6, dtype=torch.long), torch.tensor([[5]]), 1)
    assert not torch.equal(first, second)  # the request's output changed...
    assert torch.equal(first, kept)  # ...and the logits returned before did not
