"""Where a captured decode step's GPU time goes, and which Inductor settings shorten it.

Run alone on a GPU: ``python -m benchmarks.investigations.decode_profile --model qwen3-0.6b
--batch 1 --variants base,coord,eager-attn``. Per variant (Inductor settings and the model's
attention implementation, each compiled afresh): the loop of
:class:`~tunetree.generation.multistep.DecodeGraph` (16 steps per replay, Inductor's step) is
built on a 49-token prompt, its replays are timed with CUDA events (ms per step, median of
rounds), and one replay is profiled: kernels per step, the kernels' summed time against the
step's wall time (the rest is gaps between launches), and the kernels that take the most.
"""

from __future__ import annotations

if not __package__:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import collections
import contextlib
import json
import statistics
from collections.abc import Iterator
from typing import Any

import torch

from tunetree.generation.multistep_generate import MultiStepConfig, MultiStepGenerate

from .multistep_decode import _build, _floor_ms, _prompt

VARIANTS: dict[str, tuple[dict[str, Any], str | None]] = {
    "base": ({}, None),
    "coord": ({"coordinate_descent_tuning": True}, None),
    "eager-attn": ({}, "eager"),
    "eager-attn+coord": ({"coordinate_descent_tuning": True}, "eager"),
    "autotune": ({"max_autotune_gemm": True, "coordinate_descent_tuning": True}, None),
}
"""Inductor config values and the attention implementation (None: the model's own)."""


@contextlib.contextmanager
def _settings(model: Any, inductor: dict[str, Any], attention: str | None) -> Iterator[None]:
    import torch._inductor.config as inductor_config

    before = model.config._attn_implementation
    if attention is not None:
        model.set_attn_implementation(attention)
    try:
        with inductor_config.patch(inductor):
            yield
    finally:
        model.set_attn_implementation(before)


def _category(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ("gemv", "gemm", "sm90", "cutlass", "cublas", "splitk", "nvjet")):
        return "matmul (cuBLAS)"
    if any(k in low for k in ("fmha", "flash", "attention", "attn")):
        return "attention kernel"
    if low.startswith("triton"):
        return "Inductor triton"
    return "other"


def _one(model: Any, batch: int, variant: str, steps: int, rounds: int) -> dict[str, Any]:
    inductor, attention = VARIANTS[variant]
    torch._dynamo.reset()
    with _settings(model, inductor, attention):
        served = MultiStepGenerate(model, model.generate, MultiStepConfig(steps, True))
        prompt = _prompt(model.config.vocab_size, batch, 49, 99 + batch)
        kwargs = dict(prompt, max_new_tokens=256, min_new_tokens=256, do_sample=False,
                      pad_token_id=0)  # fmt: skip
        with torch.no_grad():
            served(**kwargs)
        plan, _ = served.plan((), kwargs)
        assert plan is not None
        loop = next(iter(served.loops.values()))
        replays = (plan.max_new - 1) // steps - 1
        per_round: list[float] = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.no_grad():
            for _ in range(rounds):
                first = served._prefill(loop, plan)
                loop.start(first, plan.attention_mask.sum(dim=1), 49, plan.attention_mask)
                start.record()
                for _ in range(replays):
                    loop.replay()
                end.record()
                torch.cuda.synchronize()
                per_round.append(start.elapsed_time(end) / (replays * steps))
            first = served._prefill(loop, plan)
            loop.start(first, plan.attention_mask.sum(dim=1), 49, plan.attention_mask)
            loop.replay()
            torch.cuda.synchronize()
            activities = [torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                loop.replay()
                torch.cuda.synchronize()
    kernels: collections.Counter[str] = collections.Counter()
    time_us: collections.Counter[str] = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name] += 1
            time_us[event.name] += event.device_time_total
    ms = statistics.median(per_round)
    by_cat: collections.Counter[str] = collections.Counter()
    count_cat: collections.Counter[str] = collections.Counter()
    for name, t in time_us.items():
        by_cat[_category(name)] += t / steps
        count_cat[_category(name)] += kernels[name] / steps
    floor = _floor_ms(model, batch, 49 + 128)
    print(f"### {variant}: {ms:.3f} ms/step (rounds {[round(r, 3) for r in per_round]}), "
          f"{batch * 1e3 / ms:.0f} tok/s, {100 * floor / ms:.0f}% of floor; "
          f"{sum(kernels.values()) / steps:.0f} kernels/step, kernel time "
          f"{sum(time_us.values()) / steps / 1e3:.3f} ms/step", flush=True)  # fmt: skip
    for cat, t in by_cat.most_common():
        print(f"  {cat:18s} {t:8.1f} us/step  {count_cat[cat]:6.1f} kernels/step", flush=True)
    for name, t in time_us.most_common(14):
        print(f"    {t / steps:8.1f} us  x{kernels[name] / steps:5.1f}  {name[:110]}", flush=True)
    return {
        "variant": variant, "batch": batch, "ms_per_step": ms, "rounds": per_round,
        "kernels_per_step": sum(kernels.values()) / steps,
        "kernel_ms_per_step": sum(time_us.values()) / steps / 1e3,
        "by_category_us": dict(by_cat), "floor_ms": floor,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--batch", default="1")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--variants", default="base,coord,eager-attn")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = _build(args.model, getattr(torch, args.dtype))
    rows = []
    for batch in [int(b) for b in args.batch.split(",")]:
        for variant in args.variants.split(","):
            try:
                rows.append(_one(model, batch, variant, args.steps, args.rounds))
            except Exception as exc:  # an investigation: report and go on
                print(f"### {variant}: failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
