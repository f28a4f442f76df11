"""Several decode steps per replay return exactly the tokens ``generate`` returns.

On the CPU no graph is captured and a replay runs its steps one by one: the same computation
the CUDA graph records, so the loop's bookkeeping (positions, finished rows padded, the
minimum-length rule, stopping once every row made an end-of-sequence token, a last replay
that overruns) is checked against Hugging Face's own greedy search here; the GPU test checks
the captured graph.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from tunetree.generation.multistep_generate import MultiStepConfig, MultiStepGenerate

EOS = 7


def qwen3() -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, eos_token_id=EOS,
        max_position_embeddings=512,
    )  # fmt: skip
    return transformers.Qwen3ForCausalLM(config).eval()


def prompt(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(8, 300, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, : length // 3] = 0
    return {"input_ids": ids, "attention_mask": mask}


def eager(model, inputs, **gen):
    with torch.no_grad():
        return model.generate(**inputs, **{"do_sample": False, "pad_token_id": 0, **gen})


def served(model, steps=4):
    return MultiStepGenerate(model, model.generate, MultiStepConfig(steps=steps))


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("steps", [1, 4, 7])
def test_the_loop_returns_generates_tokens_for_left_padded_rows(static: bool, steps: int) -> None:
    model = qwen3()
    inputs = prompt(3, 11, 1)
    gen = dict(max_new_tokens=19, min_new_tokens=19)
    if static:
        gen.update(cache_implementation="static", disable_compile=True)
    loop = served(model, steps)
    plan, reason = loop.plan((), {**inputs, **gen, "do_sample": False, "pad_token_id": 0})
    assert plan is not None, reason
    assert torch.equal(loop.serve(plan), eager(model, inputs, **gen))


def test_a_loop_with_another_attention_runs_it_on_a_private_copy_with_generates_tokens() -> None:
    model = qwen3()
    loop = MultiStepGenerate(model, model.generate, MultiStepConfig(4, attention="eager"))
    assert model.config._attn_implementation == "sdpa"  # the user's model keeps its own
    assert loop.step_model.config._attn_implementation == "eager"
    assert loop.step_model is not model
    ours = dict(model.named_parameters())
    for name, parameter in loop.step_model.named_parameters():
        assert parameter is ours[name]  # shared, not copied
    inputs = prompt(3, 11, 1)
    gen = dict(max_new_tokens=19, min_new_tokens=19)
    plan, reason = loop.plan((), {**inputs, **gen, "do_sample": False, "pad_token_id": 0})
    assert plan is not None, reason
    assert torch.equal(loop.serve(plan), eager(model, inputs, **gen))
    assert next(iter(loop.loops.values())).model is loop.step_model
    assert "eager attention" in loop.config.label


def test_rows_that_finish_are_padded_and_the_call_stops_when_all_have() -> None:
    model = qwen3()
    inputs = prompt(2, 9, 2)
    free = eager(model, inputs, max_new_tokens=24, eos_token_id=None)
    new = free[:, 9:]
    # the end-of-sequence token is one row 0 makes at step 5, so rows finish at other steps
    eos = int(new[0, 5])
    gen = dict(max_new_tokens=24, eos_token_id=eos)
    expected = eager(model, inputs, **gen)
    assert expected.shape[1] < free.shape[1] or (expected == 0).any()  # a row did finish
    loop = served(model, 4)
    plan, reason = loop.plan((), {**inputs, **gen, "do_sample": False, "pad_token_id": 0})
    assert plan is not None, reason
    assert torch.equal(loop.serve(plan), expected)


def test_the_minimum_length_masks_the_end_token_as_generate_does() -> None:
    model = qwen3()
    inputs = prompt(1, 9, 3)
    free = eager(model, inputs, max_new_tokens=12, eos_token_id=None)
    eos = int(free[0, 9 + 2])  # made at the third step: masked until the sixth
    gen = dict(max_new_tokens=12, min_new_tokens=6, eos_token_id=eos)
    expected = eager(model, inputs, **gen)
    loop = served(model, 4)
    plan, reason = loop.plan((), {**inputs, **gen, "do_sample": False, "pad_token_id": 0})
    assert plan is not None, reason
    assert torch.equal(loop.serve(plan), expected)


@pytest.mark.parametrize(
    "warpers", [{}, dict(temperature=0.7, top_k=20), dict(top_p=0.9, top_k=0, min_p=0.02)]
)
def test_sampling_draws_the_tokens_generate_draws_from_the_same_seed(warpers: dict) -> None:
    model = qwen3()
    inputs = prompt(2, 8, 5)
    gen = dict(max_new_tokens=15, do_sample=True, **warpers)
    torch.manual_seed(1234)
    expected = eager(model, inputs, **gen)
    loop = served(model, 4)
    plan, reason = loop.plan((), {**inputs, **gen, "pad_token_id": 0})
    assert plan is not None, reason
    torch.manual_seed(1234)  # the loop is built inside this call: building draws nothing
    assert torch.equal(loop.serve(plan), expected)


def test_one_loop_serves_prompts_of_other_lengths_and_is_reused() -> None:
    model = qwen3()
    loop = served(model, 4)
    for length, seed in ((5, 1), (17, 2), (30, 3)):
        inputs = prompt(2, length, seed)
        plan, reason = loop.plan((), {**inputs, "max_new_tokens": 10, "pad_token_id": 0})
        assert plan is not None, reason
        assert torch.equal(loop.serve(plan), eager(model, inputs, max_new_tokens=10))
    assert len(loop.loops) == 1  # one capacity bucket, one batch size


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (dict(do_sample=True, typical_p=0.5), "typical_p=0.5"),
        (dict(num_beams=2), "num_beams=2"),
        (dict(repetition_penalty=1.3), "repetition_penalty=1.3"),
        (dict(return_dict_in_generate=True), "return_dict_in_generate=True"),
        (dict(streamer=object()), "keywords the loop does not serve: streamer"),
        (dict(stopping_criteria=[]), "keywords the loop does not serve: stopping_criteria"),
        (dict(max_new_tokens=1), "fewer than two new tokens"),
        (dict(cache_implementation="offloaded"), "cache_implementation='offloaded'"),
    ],
)
def test_calls_the_loop_cannot_serve_exactly_say_why(extra: dict, why: str) -> None:
    loop = served(qwen3())
    plan, reason = loop.plan((), {**prompt(1, 5, 1), "max_new_tokens": 8, **extra})
    assert plan is None
    assert why in reason


def test_a_call_not_on_a_cuda_device_runs_the_original_generate_and_is_counted() -> None:
    model = qwen3()
    loop = served(model)
    inputs = prompt(2, 6, 4)
    out = loop(**inputs, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(out, eager(model, inputs, max_new_tokens=5))
    assert loop.counts.served == 0 and loop.counts.original == 1
    assert loop.counts.reasons == {"not on a CUDA device": 1}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_captured_loop_returns_eager_static_tokens_on_the_gpu(dtype: torch.dtype) -> None:
    model = qwen3().to("cuda", dtype)
    loop = served(model, 8)
    gen = dict(max_new_tokens=40, min_new_tokens=40, cache_implementation="static",
               disable_compile=True)  # fmt: skip
    for length, seed in ((9, 1), (21, 2)):
        inputs = {k: v.cuda() for k, v in prompt(2, length, seed).items()}
        out = loop(**inputs, **gen, do_sample=False, pad_token_id=0)
        assert torch.equal(out, eager(model, inputs, **gen))
    assert loop.counts.served == 2 and loop.counts.original == 0
    assert all(graph.graph is not None for graph in loop.loops.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_loop_outlives_an_earlier_loop_and_a_clearing_of_the_blas_workspaces() -> None:
    """Session 23's H100 crash: a loop captured after another, that other dropped, then the
    cuBLAS workspaces cleared (as Inductor's CUDA graph trees do on every warm-up): the later
    loop must own its workspace, not read and write freed memory or another tensor's."""
    import gc

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=300, hidden_size=1024, intermediate_size=3072, num_hidden_layers=2,
        num_attention_heads=16, num_key_value_heads=8, head_dim=64, eos_token_id=EOS,
        max_position_embeddings=512,
    )  # fmt: skip  # Qwen3-0.6B's widths: decode-sized matmuls that use cuBLAS's workspace
    model = transformers.Qwen3ForCausalLM(config).eval().to("cuda", torch.bfloat16)
    gen = dict(max_new_tokens=33, min_new_tokens=33, cache_implementation="static",
               disable_compile=True, do_sample=False, pad_token_id=0)  # fmt: skip
    inputs = {k: v.cuda() for k, v in prompt(2, 11, 5).items()}
    want = eager(model, inputs, **gen)
    first, later = served(model, 8), served(model, 32)
    assert torch.equal(first(**inputs, **gen), want)
    assert torch.equal(later(**inputs, **gen), want)
    del first
    gc.collect()
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    fillers = [torch.full((8 << 20,), 3.0, device="cuda") for _ in range(16)]  # 512 MiB
    for _ in range(3):
        assert torch.equal(later(**inputs, **gen), want)
    torch.cuda.synchronize()  # an illegal access is raised here at the latest
    assert all(bool((f == 3.0).all()) for f in fillers), "a replay wrote into another tensor"
    assert later.counts.served == 4 and later.counts.original == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_tune_on_a_gpu_serves_generate_with_the_loop_and_eagers_tokens() -> None:
    import tunetree as tt
    from tunetree.generation.near_tie import judge_tokens

    model = qwen3().to("cuda", torch.bfloat16)
    gen = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0,
               cache_implementation="static", disable_compile=True)  # fmt: skip

    def call(m, **x):
        return m.generate(**x, **gen)

    prompts = [{k: v.cuda() for k, v in prompt(b, n, b + n).items()} for b, n in ((1, 7), (2, 13))]
    result = tt.auto_tune(model, prompts, call=call, max_depth=0, cache=False, verbose=False)
    assert any(t.chosen for t in result.multistep), result
    assert "multi-step decode loop" in str(result)
    unseen = {k: v.cuda() for k, v in prompt(2, 10, 99).items()}
    got, want = call(result.model, **unseen), call(model, **unseen)
    # bf16: eager's tokens, or parting from them only at one of eager's own near-ties
    verdict = judge_tokens(model, got, want, unseen["attention_mask"])
    assert verdict.problem == "", verdict
    loop = result.model.__dict__["generate"]
    assert loop.counts.original == 0
    assert "generate" not in model.__dict__  # the user's model is untouched


def test_saving_a_model_whose_generate_the_loop_serves_is_refused(tmp_path) -> None:
    import tunetree as tt
    from tunetree.errors import CheckpointError
    from tunetree.generation.multistep_trial import attach

    twin = attach(qwen3(), MultiStepConfig(steps=4))
    with pytest.raises(CheckpointError, match="multi-step decode loop"):
        tt.save(twin, tmp_path / "model.tt")
    assert not (tmp_path / "model.tt").exists()


def test_off_a_gpu_every_config_is_a_row_that_says_why() -> None:
    from tunetree.generation.multistep_trial import trials_table, try_multistep
    from tunetree.signature.graph import Sample

    model = qwen3()
    samples = [Sample((), prompt(1, 5, 1))]
    trials = try_multistep(model, samples, None, lambda models: {})
    assert [t.status for t in trials] == ["unavailable"] * len(trials)
    assert {t.reason for t in trials} == {"needs a CUDA device"}
    assert "needs a CUDA device" in trials_table(trials)


def test_the_fastest_passed_config_that_beats_the_untuned_model_is_chosen() -> None:
    from tunetree.candidates.measure import Timing
    from tunetree.generation.choosing import UNTUNED, measure_and_choose
    from tunetree.generation.multistep_trial import MultiStepTrial

    def timing(ms: float) -> Timing:
        return Timing(ms / 1e3, ms / 1e3, ms / 1e3, ms / 1e3, 5, 1)

    trials = [MultiStepTrial(MultiStepConfig(s)) for s in (8, 32)]
    trials.append(MultiStepTrial(MultiStepConfig(16, True), status="rejected", reason="r"))
    for trial in trials[:2]:
        trial.status, trial.model = "passed", object()
    times = {UNTUNED: 10.0, trials[0].config.label: 4.0, trials[1].config.label: 3.0}
    measure_and_choose(trials, None, lambda models: {k: timing(times[k]) for k in models})
    assert [t.chosen for t in trials] == [False, True, False]
    assert trials[1].speedup == pytest.approx(10 / 3)
    assert trials[0].model is None and trials[1].model is not None
    slow = [MultiStepTrial(MultiStepConfig(8), status="passed", model=object())]
    measure_and_choose(
        slow, None, lambda models: {UNTUNED: timing(2.0), slow[0].config.label: timing(3.0)}
    )
    assert not slow[0].chosen and slow[0].model is None  # slower than untuned: never chosen


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_captured_sampling_loop_draws_generates_tokens_from_the_same_seed() -> None:
    model = qwen3().to("cuda", torch.bfloat16)
    loop = served(model, 8)
    gen = dict(max_new_tokens=40, min_new_tokens=40, do_sample=True, top_k=20, temperature=0.8,
               cache_implementation="static", disable_compile=True, pad_token_id=0)  # fmt: skip
    inputs = {k: v.cuda() for k, v in prompt(2, 9, 1).items()}
    torch.manual_seed(7)
    out = loop(**inputs, **gen)  # captured inside this call: building draws nothing
    torch.manual_seed(7)
    assert torch.equal(out, eager(model, inputs, **gen))
    torch.manual_seed(8)
    again = loop(**inputs, **gen)  # the captured graph replayed from another seed
    torch.manual_seed(8)
    assert torch.equal(again, eager(model, inputs, **gen))
    assert loop.counts.served == 2


def test_the_loops_of_a_compiled_config_share_one_compiled_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fake compile (the step itself, counted): three loops, one compiled callable; batches
    # above 1 leave their batch dimension to Dynamo (one compile for all of them).
    made: list[dict] = []

    def fake_compile(fn, **options):
        made.append(options)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = qwen3()
    loop = MultiStepGenerate(model, model.generate, MultiStepConfig(4, True))
    gen = dict(max_new_tokens=9, min_new_tokens=9, do_sample=False, pad_token_id=0)
    for batch, seed in ((1, 1), (3, 2), (4, 3)):
        inputs = prompt(batch, 11, seed)
        plan, reason = loop.plan((), {**inputs, **gen})
        assert plan is not None, reason
        assert torch.equal(loop.serve(plan), eager(model, inputs, **gen))
    assert sorted(batch for batch, _ in loop.loops) == [1, 3, 4]
    assert len(made) == 1 and made[0].get("dynamic") is None
    assert all(graph._compiled is loop.step for graph in loop.loops.values())
    for (batch, _), graph in loop.loops.items():
        marked = [0 in getattr(t, "_dynamo_weak_dynamic_indices", set())
                  for t in graph.batch_tensors()]  # fmt: skip
        assert len(marked) == 4 + 2 * 2  # the step's inputs, and 2 layers' keys and values
        assert all(marked) if batch > 1 else not any(marked)


def test_eager_kernels_compile_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "compile", lambda fn, **options: pytest.fail("compiled"))
    model = qwen3()
    loop = MultiStepGenerate(model, model.generate, MultiStepConfig(4))
    inputs = prompt(2, 11, 1)
    gen = dict(max_new_tokens=9, do_sample=False, pad_token_id=0)
    plan, reason = loop.plan((), {**inputs, **gen})
    assert plan is not None, reason
    assert torch.equal(loop.serve(plan), eager(model, inputs, **gen))
    assert loop.step is None


def test_inductors_settings_are_patched_only_while_the_step_compiles() -> None:
    import torch._inductor.config as inductor_config

    from tunetree.generation.multistep import INDUCTOR_SETTINGS, _inductor_settings

    before = {name: getattr(inductor_config, name) for name in INDUCTOR_SETTINGS}
    with _inductor_settings(True):
        assert all(getattr(inductor_config, k) == v for k, v in INDUCTOR_SETTINGS.items())
    with _inductor_settings(False):
        assert {name: getattr(inductor_config, name) for name in INDUCTOR_SETTINGS} == before
    assert {name: getattr(inductor_config, name) for name in INDUCTOR_SETTINGS} == before
