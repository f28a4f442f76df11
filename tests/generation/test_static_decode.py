"""Generation on a static cache at the size people serve (issue 28): one decode graph whatever
the cache's layer types, a few recorded copies whatever the number of new tokens, and a
device graph that serves every decode step of unseen prompts with eager's tokens."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import Delayed
from tests.replay_graphs import OpGraph, op_graphs  # noqa: F401 (a fixture)
from tunetree.backends.device_graph import ShapeSetRunner
from tunetree.candidates.evaluate import GraphSession
from tunetree.generation import graph_step
from tunetree.hf import cache_objects
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.binding import Binder
from tunetree.signature.graph import detach_clone

transformers = pytest.importorskip("transformers")


def mistral(sliding_window: int | None = 32) -> nn.Module:
    """A tiny Mistral whose static cache holds sliding-window layers (capacity below the window)."""
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=sliding_window,
        max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.MistralForCausalLM(config).eval()


def qwen2() -> nn.Module:
    """A tiny Qwen2, whose decode steps take their attention masks as a dict by layer type."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.Qwen2ForCausalLM(config).eval()


def static(tokens: int) -> Any:
    def call(model: Any, **inputs: Any) -> torch.Tensor:
        with torch.no_grad():
            return model.generate(
                **inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                pad_token_id=0, cache_implementation="static", disable_compile=True,
            )  # fmt: skip

    return call


def prompt(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, : length // 3] = 0
    return {
        "input_ids": torch.randint(3, 300, (batch, length), generator=g),
        "attention_mask": mask,
    }


PROMPTS = [prompt(1, 8, 1), prompt(2, 12, 2)]


def _steps(info: tt.ModelInfo, model: nn.Module) -> dict[str, list[Any]]:
    names = Binder.of_module(model).names
    found: dict[str, list[Any]] = {"prefill": [], "decode": []}
    for graph in info.modules[""].graphs.values():
        found.setdefault(graph_step(graph, names) or "other", []).append(graph)
    return found


def test_a_sliding_window_static_cache_gives_one_decode_graph() -> None:
    model = mistral()
    layer = transformers.StaticCache(config=model.config, max_cache_len=20).layers[0]
    assert type(layer).__name__ == "StaticSlidingWindowLayer"  # the case the issue hit
    info = tt.inspect(model, PROMPTS, call=static(6))
    steps = _steps(info, model)
    (decode,) = steps["decode"]
    # Batch and capacity are ranges: every prompt's decode steps share one graph.
    assert {d.name: (d.min, d.max) for d in decode.key.dims().values()}.keys() >= {"batch"}
    assert decode.calls == 2 * 5  # every decode step of both prompts counted
    assert len(decode.samples) == 2 * 2  # two copies per generate


def test_copies_do_not_grow_with_the_number_of_new_tokens() -> None:
    model = mistral()
    short = tt.inspect(model, PROMPTS, call=static(4)).recording
    long = tt.inspect(model, PROMPTS, call=static(16)).recording
    assert short is not None and long is not None
    assert long.samples == short.samples, (short, long)
    assert long.copied_bytes <= 1.5 * short.copied_bytes  # the larger capacity only


def test_a_dynamic_cache_records_a_few_steps_and_describes_the_rest() -> None:
    def dynamic(tokens: int) -> Any:
        def call(model: Any, **inputs: Any) -> torch.Tensor:
            with torch.no_grad():
                return model.generate(
                    **inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                    pad_token_id=0,
                )  # fmt: skip

        return call

    model = mistral(sliding_window=None)
    short = tt.inspect(model, PROMPTS, call=dynamic(4))
    long = tt.inspect(model, PROMPTS, call=dynamic(16))
    assert short.recording is not None and long.recording is not None
    assert long.recording.samples == short.recording.samples
    decode = _steps(long, model)["decode"]  # batch 1 passes no mask: a graph of its own
    assert all(len(g.samples) == 2 and g.calls == 15 for g in decode)
    # The cache-length range spans every step, though only the first two were copied.
    longest = max(d.max for g in decode for d in g.key.dims().values())
    assert longest >= 12 + 14, [str(g.key) for g in decode]


def test_the_memory_budget_bounds_copies_and_keeps_each_graphs_first() -> None:
    model = mistral()
    info = tt.inspect(model, PROMPTS, call=static(6), max_record_bytes=1)
    assert info.recording is not None and info.recording.over_budget > 0
    assert all(g.samples for m in info.modules.values() for g in m.graphs.values())
    (decode,) = _steps(info, model)["decode"]
    assert len(decode.samples) == 1


def test_prefills_on_fresh_caches_of_any_capacity_are_one_graph() -> None:
    """``generate`` makes a fresh static cache per call, whose layers allocate their tensors in
    the first write: the inspection initialises them first (as the layer would), so prompts of
    other lengths and capacities share one prefill graph, apart from the decode steps."""
    model = mistral()
    info = tt.inspect(model, [prompt(1, 8, 1), prompt(1, 14, 3)], call=static(6))
    steps = _steps(info, model)
    (prefill,) = steps["prefill"]
    assert len(steps["decode"]) == 1
    assert len(prefill.samples) == 2
    # the capacity (prompt and new tokens less one: 13, then 19) is a range like the length
    sizes = {(d.min, d.max) for d in prefill.key.dims().values()}
    assert sizes == {(8, 14), (13, 19)}, str(prefill.key)
    for sample in prefill.samples:
        (cache,) = [v for v in sample.args if type(v).__name__ == "StaticCache"]
        assert all(layer.is_initialized for layer in cache.layers)


def _tuned_at_batch_1(model: nn.Module, call: Any) -> tt.TuneResult:
    """Tuned on two batch-1 prompts of other lengths (and capacities), every graph a fake's."""
    return tt.tune(
        model,
        [prompt(1, 8, 1), prompt(1, 14, 3)],
        call=call,
        strategy=tt.OneBackendStrategy(Delayed()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )


def test_an_unseen_prompt_on_a_fresh_cache_prefills_on_a_runner_with_eagers_tokens() -> None:
    """After the first call taught the dispatcher the layers' sizes, every fresh cache is
    initialised before the call and its prefill is routed like any other step."""
    model = mistral()
    call = static(6)
    unseen = [prompt(1, 11, 7), prompt(1, 9, 8)]
    expected = [call(model, **p) for p in unseen]
    result = _tuned_at_batch_1(model, call)
    names = Binder.of_module(model).names
    (prefill,) = [g for g in result.graphs if graph_step(g.graph, names) == "prefill"]
    assert prefill.winner is not None, result.table()
    dispatcher = dispatcher_of(result.model)
    assert dispatcher is not None
    fallbacks = dispatcher.fallback_calls
    for p, want in zip(unseen, expected, strict=True):
        assert torch.equal(call(result.model, **p), want)
    assert dispatcher.fallback_calls == fallbacks  # no prefill, no decode step ran eager
    assert prefill.graph.key in dispatcher.served


def test_a_dispatcher_learns_the_sizes_from_its_first_fresh_cache() -> None:
    """A dispatcher that never saw the cache (a loaded checkpoint) runs the first prefill on a
    fresh cache with the original forward, learning its layers' sizes, and serves the next."""
    model = mistral()
    call = static(6)
    result = _tuned_at_batch_1(model, call)
    dispatcher = dispatcher_of(result.model)
    assert dispatcher is not None
    dispatcher.call_state = type(dispatcher.call_state)()  # as a fresh dispatcher
    fallbacks = dispatcher.fallback_calls
    call(result.model, **prompt(1, 11, 7))
    assert dispatcher.fallback_calls == fallbacks + 1
    call(result.model, **prompt(1, 9, 8))
    assert dispatcher.fallback_calls == fallbacks + 1


@pytest.mark.usefixtures("op_graphs")
def test_a_device_graph_serves_every_decode_step_of_unseen_prompts() -> None:
    """Replayed op by op (tests/replay_graphs.py): the sliding window's position is a value the
    runner advances, so one capture serves every step; a larger cache reused by a later
    ``generate`` and prompt lengths never seen are served too."""
    model = mistral()
    call = static(6)
    unseen = [prompt(2, 10, 7), prompt(1, 11, 8), prompt(2, 10, 9)]
    expected = [call(model, **p) for p in unseen]
    result = tt.tune(
        model,
        PROMPTS,
        call=call,
        strategy=tt.OneBackendStrategy(tt.backends.DeviceGraph()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    decode = [g for g in result.graphs if g.graph.key.tensor_specs()[0].shape[-1] == 1]
    assert len(decode) == 1 and decode[0].winner is not None, result.table()
    dispatcher = dispatcher_of(result.model)
    assert dispatcher is not None
    replays, fallbacks = OpGraph.replays, dispatcher.fallback_calls  # tune served its calls once
    for p, want in zip(unseen, expected, strict=True):
        assert torch.equal(call(result.model, **p), want)
    # Only the prefills (one per generate, a cache initialised on first use) ran eager.
    assert dispatcher.fallback_calls - fallbacks == len(unseen)
    assert OpGraph.replays - replays == len(unseen) * 5


@pytest.mark.usefixtures("op_graphs")
def test_a_device_graph_keeps_no_copy_of_the_cache_it_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each measured or judged call gets a copy of the recorded cache; the runner copies it into
    its static inputs and must let it go when the call ends. A reference cycle made by listing
    the call's cache objects kept about seven such copies alive at once while tuning Mistral-8L
    on the H200 (0.17 GiB of its peak); the cyclic collector is off here, so one shows."""
    probed: set[Any] = set()  # shapes first captured for a probe
    real_probe = GraphSession.probe_failure

    def probing(session: GraphSession, runner: Any) -> str | None:
        before = set(getattr(runner, "captures", {}))
        try:
            return real_probe(session, runner)
        finally:
            probed.update(set(getattr(runner, "captures", {})) - before)

    monkeypatch.setattr(GraphSession, "probe_failure", probing)
    model = mistral()
    result = tt.tune(
        model,
        PROMPTS,
        call=static(6),
        strategy=tt.OneBackendStrategy(tt.backends.DeviceGraph()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    (decode,) = [g for g in result.graphs if g.graph.key.tensor_specs()[0].shape[-1] == 1]
    assert decode.winner is not None and decode.winner.runner is not None, result.table()
    runner, sample = decode.winner.runner, decode.graph.samples[0]
    # The probes' captures, one more copy of a cache each, went when the checks ended.
    assert isinstance(runner, ShapeSetRunner)
    assert probed and not probed & set(runner.served_shapes)
    gc.collect()
    gc.disable()
    try:
        args, kwargs = detach_clone((sample.args, sample.kwargs))
        (cache,) = cache_objects((args, kwargs))
        given = weakref.ref(cache.layers[0].keys)
        del cache
        runner(*args, **kwargs)
        del args, kwargs
        assert given() is None
    finally:
        gc.enable()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compiled", [False, True])
def test_cuda_graphs_serve_every_decode_step_of_a_sliding_window_cache(compiled: bool) -> None:
    model = mistral().cuda()
    call = static(6)
    cuda = [{k: v.cuda() for k, v in p.items()} for p in PROMPTS]
    unseen = [{k: v.cuda() for k, v in p.items()} for p in (prompt(2, 10, 7), prompt(1, 11, 8))]
    expected = [call(model, **p) for p in unseen]
    result = tt.tune(
        model,
        cuda,
        call=call,
        strategy=tt.OneBackendStrategy(tt.backends.DeviceGraph(compile=compiled)),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    decode = [g for g in result.graphs if g.graph.key.tensor_specs()[0].shape[-1] == 1]
    assert len(decode) == 1 and decode[0].winner is not None, result.table()
    dispatcher = dispatcher_of(result.model)
    assert dispatcher is not None
    fallbacks = dispatcher.fallback_calls  # tune's own check served its calls once
    for p, want in zip(unseen, expected, strict=True):
        assert torch.equal(call(result.model, **p), want)
    assert dispatcher.fallback_calls - fallbacks == len(unseen)  # the prefills only


@pytest.mark.usefixtures("op_graphs")
@pytest.mark.parametrize("family", [mistral, qwen2])
def test_a_decode_step_passing_back_the_runners_cache_is_not_walked_again(
    monkeypatch: pytest.MonkeyPatch, family: Any
) -> None:
    """Dispatch per token stays cheap: once a device graph returned its cache object, the next
    steps pass it back and are routed by the object's identity (``Runner.owned_ids``), without
    reading the cache's layers attribute by attribute to sign the call, nor keying the call
    again (Qwen2 passes its masks in a dict: before the dict was signed cheaply, every step was
    keyed, 0.23 ms per token on the H200)."""
    model = family()
    call = static(6)
    result = tt.tune(
        model,
        PROMPTS,
        call=call,
        strategy=tt.OneBackendStrategy(tt.backends.DeviceGraph()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    call(result.model, **PROMPTS[0])  # routes learned for this prompt's shapes
    from tunetree.signature import binding

    read: list[str] = []
    real = binding.key_value

    def counting(attributes: Any, name: str) -> Any:
        read.append(name)
        return real(attributes, name)

    from tunetree.signature import graph

    keyed = 0
    key_of = graph.GraphKey.of.__func__  # type: ignore[attr-defined]

    def counting_key(cls: Any, args: Any, kwargs: Any) -> Any:
        nonlocal keyed
        keyed += 1
        return key_of(cls, args, kwargs)

    monkeypatch.setattr(binding, "key_value", counting)
    monkeypatch.setattr(graph.GraphKey, "of", classmethod(counting_key))
    replays = OpGraph.replays
    call(result.model, **PROMPTS[0])
    assert OpGraph.replays - replays == 5  # every decode step replayed
    # Keyed: the prefill on its fresh cache, and the first decode step on the prefill's cache.
    assert keyed <= 2, keyed
    # The prefill's and the first decode step's caches (new objects) are read (44 attributes
    # here); the 4 steps that pass back the runner's own cache object are not (152 without).
    assert len(read) <= 60, len(read)
