"""Several decode steps per CUDA graph replay against eager and HF's compiled static cache.

Run alone on a GPU: ``python -m benchmarks.investigations.multistep_decode --models qwen3-0.6b
--batches 1,8 --tokens 256 --dtype bfloat16``. Per model and batch: ms per new token
(``(T(N) - T(1)) / (N - 1)`` of whole ``generate`` calls, rounds interleaved, medians), tok/s,
% of the bandwidth floor (weights + KV bytes read per token at 4.8 TB/s), and whether the
tokens equal eager's (dynamic cache, the usual call) and eager's on a static cache.
"""

from __future__ import annotations

if not __package__:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from tunetree._util.table import format_table
from tunetree.generation.multistep_generate import MultiStepConfig, MultiStepGenerate

from ..common.generate_models import configs

BANDWIDTH = 4.8e12


def _prompt(vocab: int, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, : length // 3] = 0
    return {"input_ids": ids.cuda(), "attention_mask": mask.cuda()}


def _build(name: str, dtype: torch.dtype) -> Any:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            torch.manual_seed(0)
            model = configs("cuda", False)[name]()
    finally:
        torch.set_default_dtype(before)
    return model.eval()


def _floor_ms(model: Any, batch: int, context: int) -> float:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    emb = model.get_input_embeddings().weight
    weights -= emb.numel() * emb.element_size() if not cfg.tie_word_embeddings else 0
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * context * batch
    return (weights + kv * emb.element_size()) / BANDWIDTH * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="qwen3-0.6b")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--length", type=int, default=49)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", default="16")
    parser.add_argument("--compiled", action="store_true", help="also Inductor's step")
    parser.add_argument("--skip-hf-static", action="store_true")
    parser.add_argument(
        "--skip-static-calls",
        action="store_true",
        help="leave out eager static and the loop called with a static cache",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        model = _build(name, dtype)
        params = sum(p.numel() for p in model.parameters())
        print(f"## {name}: {params / 1e6:.0f}M parameters, {args.dtype}", flush=True)
        for batch in [int(b) for b in args.batches.split(",")]:
            rows += _one(model, name, batch, args)
            _report(rows, args.out)  # after each: a run cut short keeps what it measured
        del model
        torch.cuda.empty_cache()


def _report(rows: list[dict[str, Any]], out: str | None) -> None:
    headers = ["model", "batch", "approach", "ms/token", "tok/s", "% floor", "vs HF static",
               "= eager", "= eager static", "setup s"]  # fmt: skip
    table = [[r[h] for h in headers] for r in rows]
    print(format_table(headers, table), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


def _gen(model: Any, tokens: int, **extra: Any) -> Callable[..., Any]:
    def call(generate: Callable[..., Any], **inputs: Any) -> Any:
        with torch.no_grad():
            return generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens,
                            do_sample=False, pad_token_id=0, **extra)  # fmt: skip

    return call


def _approaches(
    model: Any, args: argparse.Namespace
) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """Each approach's generate and the settings it is called with."""
    static = dict(cache_implementation="static", disable_compile=True)
    approaches: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
        "eager": (model.generate, {})
    }
    if not args.skip_static_calls:
        approaches["eager static"] = (model.generate, static)
    if not args.skip_hf_static:
        approaches["HF static"] = (model.generate, dict(cache_implementation="static"))
    for steps in [int(s) for s in args.steps.split(",")]:
        for compiled in (False, True) if args.compiled else (False,):
            config = MultiStepConfig(steps=steps, compiled=compiled)
            served = MultiStepGenerate(model, model.generate, config)
            approaches[f"multistep {config.label}"] = (served, {})
            if not args.skip_static_calls:
                approaches[f"multistep {config.label}, static call"] = (served, static)
    return approaches


def _one(model: Any, name: str, batch: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    vocab = model.config.vocab_size
    prompt = _prompt(vocab, batch, args.length, 99 + batch)
    n = args.tokens
    approaches = _approaches(model, args)
    outputs: dict[str, torch.Tensor] = {}
    setup: dict[str, float] = {}
    for label, (generate, extra) in approaches.items():
        torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            outputs[label] = _gen(model, n, **extra)(generate, **prompt)
            _gen(model, 1, **extra)(generate, **prompt)
        except Exception as exc:
            print(f"{label}: failed: {type(exc).__name__}: {exc}"[:400], flush=True)
            continue
        torch.cuda.synchronize()
        setup[label] = time.perf_counter() - start
    times: dict[str, dict[int, list[float]]] = {k: {n: [], 1: []} for k in outputs}
    for _ in range(args.rounds):
        for label in outputs:
            generate, extra = approaches[label]
            for count in (n, 1):
                torch.cuda.synchronize()
                start = time.perf_counter()
                _gen(model, count, **extra)(generate, **prompt)
                torch.cuda.synchronize()
                times[label][count].append(time.perf_counter() - start)
    floor = _floor_ms(model, batch, args.length + n // 2)
    per = {
        k: (statistics.median(v[n]) - statistics.median(v[1])) / (n - 1) * 1e3
        for k, v in times.items()
    }
    rows = []
    for label, ms in per.items():
        out = outputs[label]
        rows.append({
            "model": name, "batch": batch, "approach": label, "ms/token": f"{ms:.3f}",
            "tok/s": f"{batch * 1e3 / ms:.0f}", "% floor": f"{100 * floor / ms:.0f}%",
            "vs HF static": f"{per['HF static'] / ms:.2f}x" if "HF static" in per else "-",
            "= eager": _same(out, outputs.get("eager")),
            "= eager static": _same(out, outputs.get("eager static")),
            "setup s": f"{setup[label]:.1f}",
        })  # fmt: skip
    for label, (generate, _) in approaches.items():
        if isinstance(generate, MultiStepGenerate) and label in outputs:
            print(f"{label}: counts {generate.counts}", flush=True)
    return rows


def _same(a: torch.Tensor, b: torch.Tensor | None) -> str:
    if b is None:
        return "-"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if torch.equal(a, b):
        return "equal"
    first = int((a != b).any(dim=0).nonzero()[0])
    return f"differ from {first}"


if __name__ == "__main__":
    main()
