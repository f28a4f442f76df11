"""A declared envelope on ``generate``: ``dynamic_shapes`` names the prompt's axes.

Users tune on a few prompts and then serve any prompt up to a length and batch they know. With
``call=`` the declared axes are the call's inputs (the prompt's ids and mask); tunetree runs
``generate`` at the envelope's ends, so the prefill and decode graphs recorded from the tuning
prompts reach the longest prompt at the largest batch (and a decode step's cache what it
brings) and the shortest prompt of two tokens or more (a one-token prompt's prefill keys apart,
as a size-1 axis does, and runs the original forward unless a tuning prompt had one token).
The fast tests read the recorded ranges; the slow one builds ONNX Runtime runners over them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.models.conformance import assert_generates_as_eager

transformers = pytest.importorskip("transformers")

VOCAB = 200
GEN = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
ENVELOPE = {
    "input_ids": {0: tt.Dim("batch", 1, 6), 1: tt.Dim("prompt", 1, 40)},
    "attention_mask": {0: "batch", 1: "prompt"},
}
TUNING = [(2, 8, 1), (2, 12, 2), (1, 10, 3)]  # the batch of one: generate drops its mask
UNSEEN = [(5, 40, 4), (3, 3, 5), (6, 23, 6), (1, 37, 7), (4, 2, 8), (1, 2, 9)]


def llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def prompt(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, : length // 3] = 0  # a left-padded row
    return {
        "input_ids": torch.randint(3, VOCAB, (batch, length), generator=g),
        "attention_mask": mask,
    }


def generate(model: Any, **inputs: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**inputs, **GEN)


def root_graphs() -> list[str]:
    info = tt.inspect(
        llama(), [prompt(*shape) for shape in TUNING], call=generate, dynamic_shapes=ENVELOPE
    )
    return sorted(str(key) for key in info.modules[""].graphs)


def test_the_envelope_widens_every_prefill_and_decode_graph_to_its_ends() -> None:
    """Tuned on batches 1-2 and lengths 8-12, the four graphs (prefill, decode; with a mask for
    padded prompts, without for unpadded ones, which generate gives none) reach batch 6 and
    prompts of 2..40 tokens, their decode caches 40 + 3 new tokens."""
    graphs = root_graphs()
    assert len(graphs) == 4, graphs
    prefill = (
        "i64[batch {b}, seq 2..40], {mask}, i64[batch {b}, seq 2..40], DynamicCache(0 tensors: )"
    )
    decode = (
        "i64[batch {b}, 1], {mask}, i64[batch {b}, 1], "
        "DynamicCache(4 tensors: f32[batch {b}, 2, dim 1..42, 8]"
    )
    masked = "i64[batch 2..6, seq 2..43]"  # a decode step's mask: the cache and the new token
    expected = [
        "(" + prefill.format(b="2..6", mask="i64[batch 2..6, seq 2..40]"),
        "(" + decode.format(b="2..6", mask=masked),
        "(" + prefill.format(b="1..6", mask="None"),
        "(" + decode.format(b="1..6", mask="None"),
    ]
    for start in expected:
        assert any(g.startswith(start) for g in graphs), (start, graphs)


def test_a_prompt_outside_the_declared_envelope_is_refused_while_tuning() -> None:
    with pytest.raises(tt.InvalidInputError, match="outside the declared"):
        tt.inspect(llama(), [prompt(2, 50, 1)], call=generate, dynamic_shapes=ENVELOPE)


@pytest.mark.slow
def test_longer_prompts_and_larger_batches_inside_the_envelope_run_no_original_forward() -> None:
    pytest.importorskip("onnxruntime")
    model = llama()
    result = tt.tune(
        model,
        [prompt(*shape) for shape in TUNING],
        call=generate,
        dynamic_shapes=ENVELOPE,
        strategy=tt.HighestThroughputStrategy([tt.backends.OnnxRuntime()]),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    assert_generates_as_eager(result, model, generate, [prompt(*shape) for shape in UNSEEN])
