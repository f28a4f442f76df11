"""Do generate families outside the zoo tune, and does an unseen prompt run the original forward?

The families a probe found falling back or slower than eager (Phi, Qwen3-MoE, Jamba, OLMoE,
RecurrentGemma, M2M100), each from a tiny config with random weights, are tuned as a user
would: ``tt.auto_tune(model, prompts, call=generate, max_depth=1, time_budget=150)`` on three
prompts (batches 2, 3, 2; lengths 12-20; one left-padded row each), then asked for unseen
prompts inside the tuned batches (2x14, 3x18) and one outside them (1x9). A row: what served
generate (the whole-model stateful runner, a depth, or nothing), the speed-up auto_tune
measured beside the untuned model, whether the tokens equal eager's, and the calls that ran
the original forward inside the tuned batches and outside them. Run alone:
``python -m benchmarks.investigations.generate_families [--families phi,jamba]``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch

BASE = dict(
    vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)  # fmt: skip
GEN = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
TUNING = [(2, 12, 1), (3, 20, 2), (2, 16, 3)]
INSIDE = [(2, 14, 7), (3, 18, 8)]
OUTSIDE = [(1, 9, 9)]


def _families() -> dict[str, Callable[[], Any]]:
    import transformers as tf

    return {
        "phi": lambda: tf.PhiForCausalLM(tf.PhiConfig(**BASE)),
        "qwen3-moe": lambda: tf.Qwen3MoeForCausalLM(
            tf.Qwen3MoeConfig(
                **BASE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, head_dim=16
            )
        ),
        "jamba": lambda: tf.JambaForCausalLM(
            tf.JambaConfig(
                **BASE,
                num_experts=2,
                num_experts_per_tok=1,
                attn_layer_period=2,
                attn_layer_offset=1,
                expert_layer_period=2,
                expert_layer_offset=1,
                mamba_d_state=8,
                mamba_dt_rank=8,
                use_mamba_kernels=False,
            )
        ),
        "olmoe": lambda: tf.OlmoeForCausalLM(
            tf.OlmoeConfig(**BASE, num_experts=4, num_experts_per_tok=2)
        ),
        "recurrent-gemma": lambda: tf.RecurrentGemmaForCausalLM(
            tf.RecurrentGemmaConfig(
                vocab_size=500,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=1,
                lru_width=64,
                attention_window_size=32,
                block_types=["recurrent", "attention"],
            )
        ),
        "m2m100": lambda: tf.M2M100ForConditionalGeneration(
            tf.M2M100Config(
                vocab_size=500,
                d_model=64,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=128,
                decoder_ffn_dim=128,
                max_position_embeddings=256,
                pad_token_id=0,
                decoder_start_token_id=2,
                eos_token_id=2,
            )
        ),
    }


def _prompt(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, : length // 3] = 0  # a left-padded row
    return {"input_ids": ids, "attention_mask": mask}


def _originals(tuned: Any) -> int:
    """Calls the tuned model's forward handed to the original forward so far."""
    from tunetree.runtime.wrap import dispatcher_of
    from tunetree.signature.modules import module_paths

    counts = getattr(tuned.forward, "counts", None)
    whole = counts.original if counts is not None else 0
    return whole + sum(
        d.fallback_calls for _, m in module_paths(tuned) if (d := dispatcher_of(m)) is not None
    )


def _row(name: str, build: Callable[[], Any], budget: float) -> list[str]:
    import tunetree as tt

    torch.manual_seed(0)
    model = build().eval()
    start = time.perf_counter()
    result = tt.auto_tune(
        model,
        [_prompt(*shape) for shape in TUNING],
        call=lambda m, **x: m.generate(**x, **GEN),
        max_depth=1,
        time_budget=budget,
        cache=False,
        verbose=False,
    )
    seconds = time.perf_counter() - start
    print(f"{name}:\n{result}", flush=True)
    tuned = result.model
    whole = getattr(tuned.forward, "counts", None) is not None
    served = "whole model" if whole else f"depth {result.depth}"
    if result.depth is None and not whole:
        served = "untuned"
    equal, ran = True, {"inside": 0, "outside": 0}
    for shapes, which in ((INSIDE, "inside"), (OUTSIDE, "outside")):
        for shape in shapes:
            prompt = _prompt(*shape)
            before = _originals(tuned)
            with torch.no_grad():
                expected = model.generate(**prompt, **GEN)
                equal &= torch.equal(tuned.generate(**prompt, **GEN), expected)
            ran[which] += _originals(tuned) - before
    result.undo()
    speedup = f"{result.speedup:.2f}x" if result.speedup else "-"
    return [
        name,
        served,
        speedup,
        f"{seconds:.0f}",
        str(equal),
        str(ran["inside"]),
        str(ran["outside"]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default=None, help="comma-separated (default: all)")
    parser.add_argument("--budget", type=float, default=150.0)
    args = parser.parse_args()
    from tunetree._util.table import format_table

    print("load average before:", os.getloadavg(), flush=True)
    families = _families()
    names = args.families.split(",") if args.families else list(families)
    rows = []
    for name in names:
        try:
            rows.append(_row(name, families[name], args.budget))
        except Exception as exc:  # a family that cannot be built here is a row, not a stop
            rows.append([name, f"error: {type(exc).__name__}: {str(exc)[:80]}", "", "", "", "", ""])
        print(rows[-1], flush=True)
    header = ["family", "served by", "speed-up", "tune s", "tokens = eager", "orig. inside",
              "orig. outside"]  # fmt: skip
    print(format_table(header, rows))
    print("load average after:", os.getloadavg())


if __name__ == "__main__":
    main()
