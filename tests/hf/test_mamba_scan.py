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
from tunetree.backends import selective_scan
from tunetree.backends.export_context import exporting
from tunetree.backends.selective_scan import CHUNK, SCAN_NAME, chunked_scan
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.modules import module_paths

transformers = pytest.importorskip("transformers")
modeling_mamba = pytest.importorskip("transformers.models.mamba.modeling_mamba")

VOCAB = 300
GEN = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)


def mamba() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, conv_kernel=4,
        expand=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.MambaForCausalLM(config).eval()


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


def test_a_mamba_layer_scans_the_same_while_exporting_and_the_scan_is_put_back() -> None:
    model = mamba()
    original = getattr(modeling_mamba, SCAN_NAME)
    g = torch.Generator().manual_seed(0)
    for length in (1, 7, 40):
        ids = torch.randint(3, VOCAB, (2, length), generator=g)
        with torch.no_grad():
            want = model(input_ids=ids, use_cache=True)
            with exporting(model):
                assert getattr(modeling_mamba, SCAN_NAME) is not original
                got = model(input_ids=ids, use_cache=True)
                plain = model(input_ids=ids, use_cache=False)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(plain.logits, want.logits, rtol=1e-4, atol=1e-5)
        for ours, eager in zip(
            got.past_key_values.layers, want.past_key_values.layers, strict=True
        ):
            torch.testing.assert_close(ours.recurrent_states[0], eager.recurrent_states[0])
            torch.testing.assert_close(ours.conv_states[0], eager.conv_states[0])
    assert getattr(modeling_mamba, SCAN_NAME) is original
    assert not selective_scan._installed


def test_only_the_exporting_thread_scans_without_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's eager model serving in another thread while one exports keeps eager's scan."""
    calls: list[str] = []
    loop_free = selective_scan._loop_free

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(threading.current_thread().name)
        return loop_free(*args, **kwargs)

    monkeypatch.setattr(selective_scan, "_loop_free", spy)
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


def prompt(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, : length // 3] = 0  # a left-padded row
    ids = torch.randint(3, VOCAB, (batch, length), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask}


def generate(model: Any, **inputs: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**inputs, **GEN)


def originals(model: nn.Module) -> int:
    return sum(
        d.fallback_calls for _, m in module_paths(model) if (d := dispatcher_of(m)) is not None
    )


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
    assert result.graphs and all(g.winner is not None for g in result.graphs), result.table()
    tuned = result.model
    before = originals(tuned)
    for shape in [(2, 14, 7), (3, 18, 8), (2, 13, 9)]:
        unseen = prompt(*shape)
        assert torch.equal(generate(tuned, **unseen), generate(model, **unseen)), shape
    assert originals(tuned) == before, result.table()


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
    before = originals(tuned)
    for batch, length in [(2, 33), (3, 17)]:
        unseen = call(batch, length)
        with torch.no_grad():
            got = tuned(**unseen).last_hidden_state
            want = model(**unseen).last_hidden_state
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert originals(tuned) == before, result.table()
