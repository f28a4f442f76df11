"""A tuned ``generate`` of every cache kind round-trips: ``tt.save``/``tt.load`` and the cache.

Three families whose plans could be written but not read back (each refused at load, and its
cache entries never served, so every tune built again):

* Mistral past its sliding window: the layer keeps ``_sliding_window_tensor``, a private
  attribute that the saved runner's input paths name, and the reader refused every private
  name;
* Mamba: a recurrent cache layer keys its states by index (``has_previous_state[0]``), but a
  graph key held every dict key as text, so the call rebuilt from the key to learn the
  runner's output structure raised ``KeyError: 0``;
* Mixtral: its experts call ``aten._grouped_mm`` on float32, which the CPU kernel runs but
  whose fake (meta) kernel accepts only bfloat16, so learning the output structure failed.

Each test tunes with ONNX Runtime alone, saves, loads into a fresh model and generates an
unseen prompt (the tokens must be eager's, every call served by a runner), then tunes again
with the same cache directory: every graph must be a hit, none built.

The zoo's other generate families (``tests/models/hf_zoo_second.py``: Qwen2-MoE, Gemma2, T5,
BART, Marian, Whisper) run the same test under ``-m slow``, built and called by the zoo's own
builders, on its tuning calls and one of its unseen calls inside the ranges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.models.hf_zoo import FAMILIES as ZOO
from tests.models.hf_zoo import tuning_calls, unseen_inside
from tunetree.runtime.wrap import dispatcher_of

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

VOCAB = 300
NEW_TOKENS = 3
SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
WINDOW = 8


def mistral() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.MistralConfig(**SMALL, sliding_window=WINDOW)
    return transformers.MistralForCausalLM(config).eval()


def mixtral() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config).eval()


def mamba() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, conv_kernel=4,
        expand=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.MambaForCausalLM(config).eval()


def prompt(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Left-padded text (as generation pads): row 1 starts a third of the way in."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, : length // 3] = 0
    ids = torch.randint(3, VOCAB, (batch, length), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask}


GREEDY = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "do_sample": False}


def generate(model: Any, settings: dict[str, Any] = GREEDY, **inputs: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**inputs, **settings)


def tune(
    model: nn.Module,
    prompts: list[dict[str, Any]],
    cache: tt.TuningCache,
    settings: dict[str, Any] = GREEDY,
) -> Any:
    def call(model: Any, **inputs: Any) -> torch.Tensor:
        return generate(model, settings, **inputs)

    return tt.tune(
        model,
        prompts,
        call=call,
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        cache=cache,
        verbose=False,
    )


@dataclasses.dataclass(frozen=True)
class Case:
    """A family to round-trip: how to build it, the prompts to tune on, an unseen prompt and
    the keyword arguments of its ``generate``."""

    build: Callable[[], nn.Module]
    prompts: list[dict[str, Any]]
    unseen: dict[str, Any]
    settings: dict[str, Any] = dataclasses.field(default_factory=lambda: GREEDY)


def zoo(name: str, lengths: tuple[int, int, int] | None = None) -> Case:
    """The zoo's generate family ``name``: its tuning calls and its last unseen call inside
    the ranges (or its batches at ``lengths`` and batch 2 between the last two), fewer new
    tokens."""
    family = ZOO[name]
    assert family.generate is not None, name
    settings = {**family.generate, **GREEDY}
    if lengths is None:
        return Case(family.build, tuning_calls(family), unseen_inside(family)[-1], settings)
    shapes = zip(family.batches, lengths, strict=True)
    prompts = [family.call(batch, length, seed) for seed, (batch, length) in enumerate(shapes)]
    unseen = family.call(2, (lengths[1] + lengths[2]) // 2, 11)
    return Case(family.build, prompts, unseen, settings)


FAMILIES: dict[str, Case] = {
    # prompts past the window (8): the decode steps read the layer's private tensor
    "mistral-sliding-window": Case(mistral, [prompt(2, 10, 1), prompt(2, 14, 2)], prompt(2, 12, 7)),
    # Mamba's prefill exports with a length range (its scan has no loop over the sequence)
    "mamba": Case(mamba, [prompt(2, 8, 1), prompt(2, 12, 2)], prompt(2, 10, 7)),
    "mixtral": Case(mixtral, [prompt(2, 8, 1), prompt(2, 12, 2)], prompt(2, 10, 7)),
}
ZOO_FAMILIES = ["qwen2-moe", "gemma2", "t5", "bart", "marian", "whisper"]
CASES = [
    *FAMILIES,
    *(pytest.param(name, marks=pytest.mark.slow) for name in ZOO_FAMILIES),
]


def case(family: str) -> Case:
    return FAMILIES[family] if family in FAMILIES else zoo(f"{family}-generate")


@pytest.mark.parametrize("family", CASES)
def test_a_tuned_generate_saves_loads_with_eagers_tokens_and_its_cache_serves(
    family: str, tmp_path: Path
) -> None:
    c = case(family)
    want = generate(c.build(), c.settings, **c.unseen)
    first = tt.TuningCache(tmp_path / "cache")
    result = tune(c.build(), c.prompts, first, c.settings)
    assert first.stats.stored == len(result.graphs) > 0, first.stats
    assert all(g.winner is not None for g in result.graphs), result.table()

    loaded = tt.load(c.build(), tt.save(result, tmp_path / f"{family}.tt"))
    assert torch.equal(generate(loaded, c.settings, **c.unseen), want)
    assert dispatcher_of(loaded).fallback_calls == 0  # every step served by a loaded runner

    again = tt.TuningCache(tmp_path / "cache")
    second = tune(c.build(), c.prompts, again, c.settings)
    stats = again.stats
    assert stats.hits == len(second.graphs) and stats.misses == stats.invalid == 0, stats
    assert all(g.winner is not None for g in second.graphs), second.table()
    assert torch.equal(generate(second.model, c.settings, **c.unseen), want)
