"""Generate families a probe found running the original forward inside their tuned ranges.

Phi, Qwen3-MoE and OLMoE (tiny configs, random weights) are decoder-only: the whole-model
stateful runner serves every batch and length up to the model's maximum, so an unseen prompt
runs no original forward at all. Before the stateful runner, these families were tuned per
graph at depth 0/1 and an unseen prompt inside the tuned batches ran 4-5 steps in the original
forward (``input signature ... was not seen while tuning``); OLMoE was slower than eager.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("openvino")

import tunetree as tt  # noqa: E402
from tests.models.conformance import original_calls  # noqa: E402
from tunetree.errors import BackendError  # noqa: E402
from tunetree.generation.stateful import stateful_model  # noqa: E402

GEN = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
BASE = dict(
    vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)  # fmt: skip


def _phi() -> torch.nn.Module:
    return transformers.PhiForCausalLM(transformers.PhiConfig(**BASE))


def _qwen3_moe() -> torch.nn.Module:
    config = transformers.Qwen3MoeConfig(
        **BASE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, head_dim=16
    )
    return transformers.Qwen3MoeForCausalLM(config)


def _olmoe() -> torch.nn.Module:
    config = transformers.OlmoeConfig(**BASE, num_experts=4, num_experts_per_tok=2)
    return transformers.OlmoeForCausalLM(config)


FAMILIES: dict[str, Callable[[], torch.nn.Module]] = {
    "phi": _phi,
    "qwen3-moe": _qwen3_moe,
    "olmoe": _olmoe,
}


def _zamba2() -> torch.nn.Module:
    config = transformers.Zamba2Config(
        vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, mamba_d_state=8, mamba_headdim=16,
        n_mamba_heads=8, mamba_ngroups=1, max_position_embeddings=256, use_mem_rope=False,
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
        use_shared_attention_adapter=False, adapter_rank=8,
    )  # fmt: skip
    return transformers.Zamba2ForCausalLM(config)


def _prompt(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, : length // 3] = 0  # a left-padded row
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_unseen_prompts_generate_eagers_tokens_without_the_original_forward(family: str) -> None:
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    tuned = stateful_model(model)
    before = tuned.forward.counts.original
    # the probe's unseen prompts inside its tuned batches (2x14, 3x18) and one outside (1x9)
    for batch, length, seed in [(2, 14, 7), (3, 18, 8), (1, 9, 9)]:
        prompt = _prompt(batch, length, seed)
        with torch.no_grad():
            expected = model.generate(**prompt, **GEN)
            got = tuned.generate(**prompt, **GEN)
        assert torch.equal(got, expected), (batch, length)
    assert tuned.forward.counts.original == before, tuned.forward.counts.reasons


def _all_original_calls(model: torch.nn.Module) -> tuple[int, int]:
    """Calls run by the original forward (the stateful forward's and the tuned graphs'), and
    calls some tuned runner served (0, 0 for a model auto_tune left untuned)."""
    counts = getattr(model.forward, "counts", None)
    original = original_calls(model) + (counts.original if counts is not None else 0)
    return original, counts.served if counts is not None else 0


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_auto_tune_serves_unseen_prompts_inside_its_batches_without_the_original_forward(
    family: str,
) -> None:
    """The probe's own call: ``auto_tune`` on generate (depth 1 at most), then unseen prompts
    inside the tuned batches. Before ``auto_tune`` tried the stateful runner, Phi and Qwen3-MoE
    were tuned per graph and these prompts ran steps in the original forward."""
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()

    def generate(m: torch.nn.Module, **x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return m.generate(**x, **GEN)

    tuning = [_prompt(2, 12, 1), _prompt(3, 20, 2), _prompt(2, 16, 3)]
    result = tt.auto_tune(
        model, tuning, call=generate, max_depth=1, time_budget=60, cache=False, verbose=False
    )
    tuned = result.model
    original, served = _all_original_calls(tuned)
    for batch, length, seed in [(2, 14, 7), (3, 18, 8)]:
        prompt = _prompt(batch, length, seed)
        assert torch.equal(generate(tuned, **prompt), generate(model, **prompt)), (batch, length)
    after, served_after = _all_original_calls(tuned)
    assert after == original, str(result)
    assert served_after > served, str(result)  # served whole, not left untuned


def test_a_hybrid_cache_is_refused_with_its_reason() -> None:
    """Zamba2 (Mamba layers beside shared attention) has no usable stateful runner: the refusal
    names why, so the depth search that follows is what serves it (depth 0 in the probe)."""
    torch.manual_seed(0)
    with pytest.raises(BackendError, match=r"cache layer does not hold \[batch, heads"):
        stateful_model(_zamba2().eval())
