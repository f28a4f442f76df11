"""Hugging Face ``generate`` with a KV cache: eager, HF's static-cache compile, a compiled model
on a static cache by hand, and tunetree, side by side in one run (issue 21).

Run: ``python -m benchmarks.generate --device cpu --out benchmarks/results/gen`` (``--models
gpt2,llama``; ``--quick`` for tiny configs). Models come from configs with random weights:
GPT-2 (CPU: 4 layers d256, vocabulary 8000; CUDA: GPT-2 124M), a 4-layer Llama (d512, grouped
queries), a T5-small-sized encoder-decoder. tunetree tunes through ``call=`` on prompts of
varying batch and length, then every approach generates for *unseen* prompts inside those
ranges. Per approach and batch size: time to first token (``max_new_tokens=1``), ms per new
token (``(T(N) - T(1)) / (N - 1)`` of whole ``generate`` calls, timed interleaved by
``tunetree.measure``), whether the tokens equal eager's, calls (prefill and decode) that ran the
original forward (tunetree), and tuning or compile time. Run it alone on the machine.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import argparse
import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import tunetree as tt
from tunetree._util.table import format_table
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.modules import module_paths

from . import common


def _configs(device: str, quick: bool) -> dict[str, Callable[[], Any]]:
    import transformers

    big = device == "cuda" and not quick

    def gpt2() -> Any:
        if big:
            return transformers.GPT2LMHeadModel(transformers.GPT2Config())
        layers, width, vocab = (2, 64, 500) if quick else (4, 256, 8000)
        config = transformers.GPT2Config(
            n_layer=layers, n_embd=width, n_head=4, vocab_size=vocab, n_positions=512
        )
        return transformers.GPT2LMHeadModel(config)

    def llama() -> Any:
        width, layers = (64, 2) if quick else (512, 4)
        config = transformers.LlamaConfig(
            vocab_size=500 if quick else 32000,
            hidden_size=width,
            intermediate_size=width * 11 // 4,
            num_hidden_layers=layers,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=1024,
        )
        return transformers.LlamaForCausalLM(config)

    def t5() -> Any:
        width, layers = (32, 2) if quick else (512 if big else 256, 6 if big else 4)
        config = transformers.T5Config(
            vocab_size=500 if quick else 32128,
            d_model=width,
            d_kv=width // 8,
            d_ff=width * 4,
            num_layers=layers,
            num_decoder_layers=layers,
            num_heads=8,
            decoder_start_token_id=0,
        )
        return transformers.T5ForConditionalGeneration(config)

    return {"gpt2": gpt2, "llama": llama, "t5": t5}


def _prompt(vocab: int, batch: int, length: int, seed: int, device: str) -> dict[str, Any]:
    """Token ids; with batch > 1 the second row is left-padded by a third of its length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, : length // 3] = 0
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def _generate(tokens: int, **extra: Any) -> Callable[..., Any]:
    def call(model: Any, **inputs: Any) -> Any:
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens,
                                 do_sample=False, pad_token_id=0, **extra)  # fmt: skip
        return out

    return call


def _compiled_by_hand(model: Any) -> Any:
    """Hugging Face's documented recipe by hand: the forward compiled with
    ``mode="reduce-overhead"`` (CUDA graphs; default mode on the CPU), generating on a static
    cache. A shallow copy carries the compiled forward; the model itself is untouched."""
    twin = copy.copy(model)
    mode = "reduce-overhead" if next(model.parameters()).is_cuda else None
    twin.forward = torch.compile(model.forward, mode=mode, fullgraph=True)
    return twin


def _fallbacks(model: Any) -> int:
    return sum(d.fallback_calls for _, m in module_paths(model) if (d := dispatcher_of(m)))


def run(name: str, build: Callable[[], Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    device = args.device
    torch.manual_seed(0)
    model = build().eval().to(device)
    vocab = model.config.vocab_size
    tokens = args.tokens
    lengths = [int(n) for n in args.lengths.split(",")]
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        tuning = [_prompt(vocab, batch, n, i, device) for i, n in enumerate(lengths)]
        middle = (lengths[0] + lengths[-1]) // 2 + 1
        unseen = _prompt(vocab, batch, middle, 99, device)
        gen = _generate(tokens)
        approaches: dict[str, tuple[Any, Callable[..., Any]]] = {"eager": (model, gen)}
        setup_s: dict[str, float] = {}
        static = _generate(tokens, cache_implementation="static")
        if not args.skip_static:
            start = time.perf_counter()
            static(model, **unseen)  # HF compiles its decode step on the first calls
            static(model, **unseen)
            setup_s["hf static"] = time.perf_counter() - start
            approaches["hf static"] = (model, static)
        if args.compile_by_hand:
            start = time.perf_counter()
            compiled = _compiled_by_hand(model)
            by_hand = _generate(tokens, cache_implementation="static", disable_compile=True)
            try:
                by_hand(compiled, **unseen)  # compiles (prefill and decode shapes)
                by_hand(compiled, **unseen)
                setup_s["compile by hand"] = time.perf_counter() - start
                approaches["compile by hand"] = (compiled, by_hand)
            except Exception as exc:  # a failing rival is reported, the run goes on
                print(f"compile by hand failed: {type(exc).__name__}: {str(exc)[:300]}")
        results = []
        for cache in args.tunetree_caches.split(","):
            label = "tunetree" if cache == "dynamic" else f"tunetree {cache}"
            # HF's own compile stays off: tunetree chooses what serves the decode step.
            call = gen if cache == "dynamic" else _generate(
                tokens, cache_implementation=cache, disable_compile=True
            )  # fmt: skip
            start = time.perf_counter()
            result = tt.auto_tune(
                model, tuning, call=call, max_depth=args.max_depth, time_budget=args.budget,
                cache=False, verbose=args.verbose, device=device,
            )  # fmt: skip
            setup_s[label] = time.perf_counter() - start
            print(result)
            approaches[label] = (result.model, call)
            results.append(result)
        rows += _measure(name, batch, middle, tokens, unseen, approaches, setup_s, device)
        for result in results:
            result.undo()
    return rows


def _measure(
    name: str,
    batch: int,
    length: int,
    tokens: int,
    prompt: dict[str, Any],
    approaches: dict[str, tuple[Any, Callable[..., Any]]],
    setup_s: dict[str, float],
    device: str,
) -> list[dict[str, Any]]:
    reference = approaches["eager"][1](approaches["eager"][0], **prompt)
    candidates: dict[str, Callable[[], object]] = {}
    for label, (model, gen) in approaches.items():
        candidates[f"{label}|N"] = lambda m=model, g=gen: g(m, **prompt)
        one = _first_token_call(label)
        candidates[f"{label}|1"] = lambda m=model, g=one: g(m, **prompt)
    tuned = {label: m for label, (m, _) in approaches.items() if label.startswith("tunetree")}
    before = {label: _fallbacks(m) for label, m in tuned.items()}
    timings = tt.measure(candidates, device, tt.MeasureConfig(max_s_per_candidate=4.0))
    fallbacks = {label: _fallbacks(m) - before[label] for label, m in tuned.items()}
    eager_ms = _per_token(timings, "eager", tokens)
    rows = []
    for label, (model, gen) in approaches.items():
        same = torch.equal(gen(model, **prompt), reference)
        per_token = _per_token(timings, label, tokens)
        rows.append(
            {
                "model": name,
                "batch": batch,
                "prompt": length,
                "new tokens": tokens,
                "approach": label,
                "ms per new token": round(per_token, 3),
                "vs eager": round(eager_ms / per_token, 2),
                "time to first token ms": round(timings[f"{label}|1"].median_s * 1e3, 2),
                "tokens equal eager": same,
                "original-forward calls": fallbacks.get(label, "-"),
                "setup s": round(setup_s.get(label, 0.0), 1),
            }
        )
    return rows


def _first_token_call(label: str) -> Callable[..., Any]:
    """``generate`` of one new token, the way ``label`` generates."""
    if label == "hf static":
        return _generate(1, cache_implementation="static")
    if label == "compile by hand":
        return _generate(1, cache_implementation="static", disable_compile=True)
    if label.startswith("tunetree "):
        return _generate(1, cache_implementation=label.split()[1], disable_compile=True)
    return _generate(1)


def _per_token(timings: dict[str, tt.Timing], label: str, tokens: int) -> float:
    whole, first = timings[f"{label}|N"].median_s, timings[f"{label}|1"].median_s
    return (whole - first) / max(1, tokens - 1) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--models", default="gpt2,llama,t5")
    p.add_argument("--batches", default="1,4")
    p.add_argument("--lengths", default="16,64,128", help="tuning prompt lengths")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per generate call")
    p.add_argument("--budget", type=float, default=300.0, help="tunetree's time budget, s")
    p.add_argument("--max-depth", type=int, default=1)
    p.add_argument("--skip-static", action="store_true", help="leave out HF's static cache")
    p.add_argument(
        "--compile-by-hand",
        action="store_true",
        help="also torch.compile(model.forward, mode='reduce-overhead') on a static cache",
    )
    p.add_argument(
        "--tunetree-caches",
        default="dynamic,static",
        help="the caches tunetree tunes generate with: dynamic (HF's default), static",
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    common.cuda_setup(args.device)
    header = common.header(common.command_line())
    builders = _configs(args.device, args.quick)
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        rows += run(name, builders[name], args)
        print(format_table(list(rows[0]), [list(r.values()) for r in rows], title="generate"))
    common.write_json(args.out, "generate.json", {"header": header, "rows": rows})


if __name__ == "__main__":
    main()
