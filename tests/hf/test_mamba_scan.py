"""Mamba's prefill exports with a symbolic length (the selective scan without a Python loop).

Without the ``mamba_ssm`` kernels, transformers scans a Mamba prompt in a Python loop over its
length, so an exported prefill held the length it was traced at and every prompt of another
length inside the tuned range ran the original forward. While exporting (only there), the scan
is :func:`tunetree.backends.selective_scan.chunked_scan`: a loop of fixed length over chunks.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.hf.test_generation_round_trip import VOCAB, mamba, prompt
from tests.models.conformance import assert_generates_as_eager, original_calls
from tunetree.backends import selective_scan
from tunetree.backends.export_context import exporting
from tunetree.backends.selective_scan import CHUNK, SCAN_NAME, chunked_scan

transformers = pytest.importorskip("transformers")
modeling_mamba = pytest.importorskip("transformers.models.mamba.modeling_mamba")

GEN = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)


def loop(decay_log: torch.Tensor, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager's recurrence, step by step."""
    state = torch.zeros_like(inputs[:, :, 0])
    states = []
    for t in range(inputs.shape[2]):
        state = decay_log[:, :, t].exp() * state + inputs[:, :, t]
        states.append(state)
    return torch.stack(states, dim=2), state


@pytest.mark.parametrize("length", [1, 2, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5])
def test_the_chunked_scan_equals_the_loop(length: int) -> None:
    g = torch.Generator().manual_seed(length)
    decay_log = -3 * torch.rand(2, 5, length, 4, generator=g)  # decays exp(-3)..1
    inputs = torch.randn(2, 5, length, 4, generator=g)
    want, want_last = loop(decay_log, inputs)
    states, last = chunked_scan(decay_log, inputs)
    assert states.shape == want.shape and last.shape == want_last.shape
    torch.testing.assert_close(states, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(last, want_last, rtol=1e-5, atol=1e-6)


class Prefill(nn.Module):
    """Mamba's forward as an exporter sees it: logits and every layer's cache states."""

    def __init__(self, model: nn.Module, use_cache: bool) -> None:
        super().__init__()
        self.model, self.use_cache = model, use_cache

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids=ids, use_cache=self.use_cache)
        if not self.use_cache:
            return (out.logits,)
        layers = out.past_key_values.layers
        return (
            out.logits,
            *(layer.recurrent_states[0] for layer in layers),
            *(layer.conv_states[0] for layer in layers),
        )


def export(module: nn.Module, shortest: int, length: int = 20) -> Any:
    ids = torch.randint(3, VOCAB, (2, length), generator=torch.Generator().manual_seed(length))
    seq = torch.export.Dim("seq", min=shortest, max=96)
    with torch.no_grad():
        return torch.export.export(module, (ids,), dynamic_shapes=({1: seq},)).module()


@pytest.mark.parametrize("use_cache", [True, False])
def test_an_export_with_a_length_range_keeps_eagers_logits_and_cache_states(
    use_cache: bool,
) -> None:
    """Exported once with a symbolic length, run at unseen lengths (1 included, and past one
    chunk): logits, SSM states and conv states are eager's; the scan is put back after.
    With a cache, transformers' conv state update needs 4 steps (the kernel) or more."""
    shortest = 4 if use_cache else 1
    model = mamba()
    original = getattr(modeling_mamba, SCAN_NAME)
    with exporting(model):
        assert getattr(modeling_mamba, SCAN_NAME) is not original
        exported = export(Prefill(model, use_cache), shortest)
    assert getattr(modeling_mamba, SCAN_NAME) is original
    assert not selective_scan._installed
    g = torch.Generator().manual_seed(0)
    for length in (shortest, 7, 40, 90):
        ids = torch.randint(3, VOCAB, (2, length), generator=g)
        with torch.no_grad():
            got = exported(ids)
            want = Prefill(model, use_cache)(ids)
        assert len(got) == len(want) == (5 if use_cache else 1)
        for ours, eager in zip(got, want, strict=True):
            torch.testing.assert_close(ours, eager, rtol=1e-4, atol=1e-5)


def test_an_export_of_one_length_keeps_eagers_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed length exports eager's loop as before (unrolled, the faster graph)."""
    calls: list[int] = []
    monkeypatch.setattr(selective_scan, "_loop_free", lambda *a, **k: calls.append(1))
    model = mamba()
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    with exporting(model), torch.no_grad():
        torch.export.export(Prefill(model, True), (ids,))
    assert calls == []


def test_only_the_exporting_thread_scans_without_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's eager model serving in another thread while one exports keeps eager's scan."""
    calls: list[str] = []
    loop_free = selective_scan._loop_free

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(threading.current_thread().name)
        return loop_free(*args, **kwargs)

    monkeypatch.setattr(selective_scan, "_loop_free", spy)
    monkeypatch.setattr(selective_scan, "_symbolic_length", lambda *a, **k: True)
    model = mamba()
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with exporting(model):
            other: list[torch.Tensor] = []
            worker = threading.Thread(
                target=lambda: other.append(model(input_ids=ids).logits), name="serving"
            )
            worker.start()
            worker.join()
            assert calls == []
            model(input_ids=ids)
    assert calls and set(calls) == {threading.current_thread().name}
    assert torch.equal(other[0], want)


def generate(model: Any, **inputs: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**inputs, **GEN)


def jamba() -> nn.Module:
    """Jamba's Mamba layers scan as Mamba's do (hybrid with attention and experts)."""
    torch.manual_seed(0)
    config = transformers.JambaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        num_experts=2, num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8,
    )  # fmt: skip
    return transformers.JambaForCausalLM(config).eval()


BACKENDS = {"onnxruntime": tt.backends.OnnxRuntime, "openvino": tt.backends.OpenVINO}
CASES = {
    "mamba-onnxruntime": (mamba, "onnxruntime"),
    "mamba-openvino": (mamba, "openvino"),
    "jamba-onnxruntime": (jamba, "onnxruntime"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_unseen_prompt_lengths_inside_the_range_are_served_by_a_runner(case: str) -> None:
    """Tuned on three prompt lengths; three others inside the range give eager's tokens with no
    call run by the original forward (before, the prefill graph held its traced lengths:
    ONNX Runtime's build said "the ONNX export fixed axis 1 ... to 20", and Jamba ran 3
    prefills in the original forward)."""
    build, backend = CASES[case]
    pytest.importorskip(backend)
    model = build()
    result = tt.tune(
        model,
        [prompt(2, 12, 1), prompt(3, 20, 2), prompt(2, 16, 3)],
        call=generate,
        strategy=tt.OneBackendStrategy(BACKENDS[backend]()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    unseen = [prompt(*shape) for shape in [(2, 14, 7), (3, 18, 8), (2, 13, 9)]]
    assert_generates_as_eager(result, model, generate, unseen)


@pytest.mark.slow
def test_a_cacheless_mamba_forward_is_served_at_unseen_lengths() -> None:
    """The forward without a cache (``MambaModel``, ``use_cache=False``) exports with a length
    range too: unseen lengths inside it are served by ONNX Runtime within eager's tolerance."""
    torch.manual_seed(0)
    model = transformers.MambaModel(mamba().config).eval()
    g = torch.Generator().manual_seed(0)

    def call(batch: int, length: int) -> dict[str, Any]:
        ids = torch.randint(3, VOCAB, (batch, length), generator=g)
        return {"input_ids": ids, "use_cache": False}

    result = tt.tune(
        model,
        [call(2, 12), call(3, 40), call(2, 26)],
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    assert result.graphs and all(g.winner is not None for g in result.graphs), result.table()
    tuned = result.model
    before = original_calls(tuned)
    for batch, length in [(2, 33), (3, 17)]:
        unseen = call(batch, length)
        with torch.no_grad():
            got = tuned(**unseen).last_hidden_state
            want = model(**unseen).last_hidden_state
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert original_calls(tuned) == before, result.table()
