"""Hugging Face ``generate`` with a KV cache: eager, HF's static-cache compile and tunetree, side by
side in one run (issues 21 and 28).

Run: ``python -m benchmarks.generate --device cuda --models mistral-8l,qwen2-0.6b,llama-0.5b
--batches 1,8 --tokens 128 --out DIR`` (``--quick`` for tiny configs). Models come from configs
with random weights: the sizes people serve (an 8-layer d1024 Mistral-style model whose static
cache is sliding-window layers, a 24-layer 0.6B Qwen2-style model with grouped queries and a
151936-token vocabulary, a 16-layer d1536 0.5B Llama-style one, a 12-layer d768 0.1B Llama-style
one for the CPU) and the small ones of issue 21 (``gpt2``, ``llama``, ``t5``).

tunetree is tuned once per model (``tt.auto_tune(model, prompts, call=generate)``, its default
strategy and time budget) on prompts of every batch size asked for, two lengths each; then every
approach generates for *unseen* prompts (another length, inside the tuned ranges). Per approach
and batch size: ms per new token (``(T(N) - T(1)) / (N - 1)`` of whole ``generate`` calls,
timed round by round, interleaved, medians), time to first token (``max_new_tokens=1``), whether
the tokens equal eager's, the calls that ran the original forward (tunetree: prefills, and decode
steps a runner did not serve), tuning time or HF's warm-up, and on CUDA the peak memory while
tuning beside eager ``generate``'s own peak. ``eager before`` is eager timed before anything was
compiled or tuned, in the same way: tuning must leave the untuned model as fast as before. Run it
alone on the machine.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import argparse
import contextlib
import copy
import functools
import gc
import statistics
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
from .common import memory_trace
from .common.generate_models import configs
from .common.interleave import timed


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


def _static(tokens: int) -> Callable[..., Any]:
    """HF's own recipe: a static cache, its decode step compiled (reduce-overhead on CUDA)."""
    return _generate(tokens, cache_implementation="static")


def _static_uncompiled(tokens: int) -> Callable[..., Any]:
    """The static cache with HF's compile off: tunetree chooses what serves the decode step."""
    return _generate(tokens, cache_implementation="static", disable_compile=True)


def _calls_of(label: str, cache: str) -> Callable[[int], Callable[..., Any]]:
    if label == "hf static":
        return _static
    if label.startswith("tunetree") and cache == "static":
        return _static_uncompiled
    return _generate


def _dispatchers(model: Any) -> list[Any]:
    """The dispatchers of the model's wrapped modules."""
    found = (dispatcher_of(module) for _, module in module_paths(model))
    return [dispatcher for dispatcher in found if dispatcher is not None]


def _captures(runner: Any) -> list[Any]:
    """A ranged device-graph runner's captures (none for other runners)."""
    return list(getattr(runner, "captures", {}).values())


def _fallbacks(model: Any) -> int:
    """Calls wrapped modules ran in their original forward (a runner's own included), and
    ``generate`` calls a multi-step decode loop handed to the original ``generate``."""
    loop = getattr(model, "__dict__", {}).get("generate")
    total = getattr(getattr(loop, "counts", None), "original", 0)
    for dispatcher in _dispatchers(model):
        total += dispatcher.fallback_calls
        for runner in dispatcher.runners.values():
            total += getattr(runner, "eager_calls", 0)
            total += sum(getattr(capture, "eager_calls", 0) for capture in _captures(runner))
    return total


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _interleaved(
    calls: dict[str, Callable[[], Any]], device: str, rounds: int
) -> dict[str, list[float]]:
    """Each call timed once per round, rounds interleaved (one untimed call first)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(rounds):
        for name, call in calls.items():
            _sync(device)
            start = time.perf_counter()
            call()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def _device_ms(call: Callable[[], Any]) -> tuple[float, float]:
    """One profiled call: its wall time and the sum of its GPU kernels' times, both in ms.

    Wall far above kernel time means the CPU (Python, launches, copies) sets the pace.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = 0.0
    for event in prof.events():
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            kernels += event.time_range.elapsed_us()
    return wall * 1e3, kernels / 1e3


def _static_bytes(model: Any) -> tuple[int, int]:
    """Captures held by the tuned model and the bytes of their static input tensors."""
    captures, size = 0, 0
    for dispatcher in _dispatchers(model):
        for runner in dispatcher.runners.values():
            held = _captures(runner) + ([runner] if hasattr(runner, "static_leaves") else [])
            for capture in held:
                captures += 1
                size += sum(
                    t.numel() * t.element_size()
                    for t in capture.static_leaves
                    if isinstance(t, torch.Tensor)
                )
    return captures, size


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def _reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def run(name: str, build: Callable[[], Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    device = args.device
    model = _build(build, device, getattr(torch, args.dtype))
    params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    tokens = args.tokens
    lengths = [int(n) for n in args.lengths.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    unseen_length = (lengths[0] + lengths[-1]) // 2 + 1
    unseen = {b: _prompt(vocab, b, unseen_length, 99 + b, device) for b in batches}
    tuning = [
        _prompt(vocab, b, n, 10 * i + j, device)
        for i, b in enumerate(batches)
        for j, n in enumerate(lengths)
    ]
    shapes = [tuple(p["input_ids"].shape) for p in tuning]
    print(f"## {name}: {params / 1e6:.0f}M parameters, tuning {shapes}, unseen {unseen_length}")

    # Eager's own peak memory, and eager timed before anything was compiled or tuned.
    _reset_peak(device)
    eager_outputs = {b: _generate(tokens)(model, **unseen[b]) for b in batches}
    eager_peak = _peak_gib(device)
    before = _eager_ms(model, unseen, tokens, device, args.rounds)
    print(f"eager before tuning, ms per new token: {before}")
    if device == "cpu":
        print(_roofline(model, before, _prompt(vocab, 1, unseen_length, 7, device)), flush=True)

    approaches: dict[str, Any] = {"eager": model}
    setup: dict[str, float] = {}
    if args.static_first and not args.skip_static:
        _warm_static(model, unseen, batches, tokens, device, setup, approaches)
    label = "tunetree" if args.cache == "dynamic" else f"tunetree {args.cache}"
    call = _calls_of(label, args.cache)(tokens)
    objects_before = len(gc.get_objects())
    start = time.perf_counter()
    result, tuning_peak = _tune(model, tuning, call, eager_peak, args)
    setup[label] = time.perf_counter() - start
    if args.slowdown_probe:
        _slowdown_probe(model, result, unseen, tokens, args, before, objects_before)
        return []
    if not args.skip_static and not args.static_first:
        # HF's side warms up after tuning, so that what its compile holds is not in tuning's peak.
        _warm_static(model, unseen, batches, tokens, device, setup, approaches)
    approaches[label] = result.model

    rows = []
    for b in batches:
        measured = {}
        for approach, served in approaches.items():
            fallbacks = _fallbacks(served)
            times = _time(served, _calls_of(approach, args.cache), unseen[b], tokens, device,
                          args.rounds)  # fmt: skip
            same = torch.equal(
                _calls_of(approach, args.cache)(tokens)(served, **unseen[b]), eager_outputs[b]
            )
            measured[approach] = (times, same, _fallbacks(served) - fallbacks)
            print(f"{name} batch {b} {approach}: {_per_token(times):.3f} ms per new token, "
                  f"same tokens {same}", flush=True)  # fmt: skip
            if args.profile and device == "cuda":
                make = _calls_of(approach, args.cache)(tokens)
                wall, kernels = _device_ms(functools.partial(make, served, **unseen[b]))
                print(f"{name} batch {b} {approach}: profiled generate {wall:.1f} ms wall, "
                      f"{kernels:.1f} ms in GPU kernels ({kernels / tokens:.3f} ms per token)",
                      flush=True)  # fmt: skip
        eager_ms = _per_token(measured["eager"][0])
        for approach, (times, same, fallbacks) in measured.items():
            per_token = _per_token(times)
            rows.append(
                {
                    "model": name,
                    "parameters M": round(params / 1e6),
                    "batch": b,
                    "prompt": unseen_length,
                    "new tokens": tokens,
                    "approach": approach,
                    "ms per new token": round(per_token, 3),
                    "spread ms": round(_spread(times), 3),
                    "vs eager": round(eager_ms / per_token, 2),
                    "tok/s": round(b * 1e3 / per_token),
                    "% of floor": (
                        round(100 * _floor_ms(model, b, unseen_length + tokens // 2) / per_token)
                        if device == "cuda"
                        else "-"
                    ),
                    "time to first token ms": round(statistics.median(times["1"]) * 1e3, 2),
                    "tokens equal eager": same,
                    "original-forward calls per generate": (
                        round(fallbacks / (2 * args.rounds + 3), 2)
                        if approach.startswith("tunetree")
                        else "-"
                    ),
                    "setup s": round(setup.get(approach, 0.0), 1),
                    "peak GiB (tuning / eager)": (
                        f"{tuning_peak:.2f} / {eager_peak:.2f}"
                        if approach.startswith("tunetree")
                        and tuning_peak is not None
                        and eager_peak is not None
                        else "-"
                    ),
                    "eager before ms": round(before[b], 3) if approach == "eager" else "-",
                    "eager after undo ms": "-",
                }
            )
    # Tuning must leave the untuned model as fast as before: eager again, the tuned twin gone.
    result.undo()
    del result, approaches
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    after = _eager_ms(model, unseen, tokens, device, args.rounds)
    for row in rows:
        if row["approach"] == "eager":
            row["eager after undo ms"] = round(after[row["batch"]], 3)
    return rows


def _build(build: Callable[[], Any], device: str, dtype: torch.dtype) -> Any:
    """The model built on ``device`` in ``dtype`` (no float32 copy of a large one first)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            return build().eval()
    finally:
        torch.set_default_dtype(before)


BANDWIDTH = 4.8e12
"""The H200's memory bandwidth by its datasheet, bytes per second: the floor's divisor."""


def _floor_ms(model: Any, batch: int, context: int) -> float:
    """ms per decode step to read the weights once and the KV cache of ``context`` positions."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    kv = 2 * config.num_hidden_layers * heads * head_dim * context * batch * element
    return (_weight_bytes_per_token(model) + kv) / BANDWIDTH * 1e3


def _eager_ms(
    model: Any, unseen: dict[int, dict[str, Any]], tokens: int, device: str, rounds: int
) -> dict[int, float]:
    """Eager ``generate``'s ms per new token on each batch size's unseen prompt."""
    return {
        b: _per_token(_time(model, _generate, p, tokens, device, rounds)) for b, p in unseen.items()
    }


def _weight_bytes_per_token(model: Any) -> int:
    """Bytes of weights a decode step reads: every parameter storage once, except an input
    embedding table that is not also the output head (a step gathers a few of its rows)."""
    storages = {p.untyped_storage().data_ptr(): p.nbytes for p in model.parameters()}
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.untyped_storage().data_ptr() == (
        embedding.untyped_storage().data_ptr()
    )
    if not tied:
        storages.pop(embedding.untyped_storage().data_ptr(), None)
    return sum(storages.values())


def _read_gbs(nbytes: int, repeats: int = 9) -> dict[str, float]:
    """This machine's read bandwidth over ``nbytes`` of fp32, with torch's threads: a sum, and a
    matrix-vector product (what a batch-1 decode step's linear layers are). Medians."""
    columns = 1024
    weights = torch.randn(max(1, nbytes // 4 // columns), columns)
    vector = torch.randn(columns)
    found = {}
    for label, fn in (("sum", weights.sum), ("matrix-vector", lambda: weights @ vector)):
        fn()
        times = [timed(fn, torch.device("cpu")) for _ in range(repeats)]
        found[label] = weights.nbytes / statistics.median(times) / 1e9
    return found


def _matmul_ms(model: Any, prompt: dict[str, Any], steps: int = 5) -> tuple[float, float]:
    """Eager's batch-1 decode step profiled: (ms per step, of which ms in matrix products)."""
    with torch.no_grad():
        out = model(**prompt, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        mask = torch.ones(1, prompt["input_ids"].shape[1] + 1, dtype=torch.long)

        def step() -> None:
            model(input_ids=token, attention_mask=mask, past_key_values=copy.deepcopy(cache))

        step()
        with torch.profiler.profile() as profile:
            for _ in range(steps):
                step()
    events = profile.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e3 / steps
    products = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear")
    matmul = sum(e.self_cpu_time_total for e in events if e.key in products) / 1e3 / steps
    return total, matmul


def _roofline(model: Any, before: dict[int, float], prompt: dict[str, Any]) -> str:
    """CPU: how close eager's batch-1 decode is to reading its weights at the machine's speed.

    A batch-1 step reads every weight once; when eager's matrix products already read them near
    the machine's bandwidth, a backend that keeps fp32 weights (the results) gains only what
    the rest of the step costs.
    """
    nbytes = _weight_bytes_per_token(model)
    machine = _read_gbs(nbytes)
    eager = {b: nbytes / (ms * 1e-3) / 1e9 for b, ms in before.items()}
    best = max(machine.values())
    step_ms, matmul_ms = _matmul_ms(model, prompt)
    return (
        f"roofline: a decode step reads {nbytes / 1e6:.0f} MB of weights; eager reads them at "
        + ", ".join(f"{gbs:.1f} GB/s (batch {b})" for b, gbs in eager.items())
        + "; this machine reads fp32 at "
        + ", ".join(f"{gbs:.1f} GB/s ({label})" for label, gbs in machine.items())
        + f"; so at fp32, batch 1 can be at most about {best / eager[min(eager)]:.2f}x eager. "
        + f"Eager's batch-1 step, profiled: {step_ms:.1f} ms, of which {matmul_ms:.1f} ms in "
        + f"matrix products ({nbytes / (matmul_ms * 1e-3) / 1e9:.1f} GB/s); with those at the "
        + f"machine's best and nothing else, {step_ms / (nbytes / best / 1e6):.2f}x"
    )


def _tune(
    model: Any,
    tuning: list[dict[str, Any]],
    call: Any,
    eager_peak: float | None,
    args: argparse.Namespace,
) -> tuple[Any, float | None]:
    """``tt.auto_tune`` on the tuning prompts; its result and the peak memory while tuning."""
    device = args.device
    _reset_peak(device)
    resident_before = torch.cuda.memory_allocated() if device == "cuda" else 0
    trace: contextlib.AbstractContextManager[dict[str, Any]] = (
        memory_trace.traced() if args.memory_trace else contextlib.nullcontext({})
    )
    with trace as recorded:
        result = tt.auto_tune(
            model, tuning, call=call, max_depth=args.max_depth, time_budget=args.budget,
            cache=False, verbose=args.verbose, device=device,
        )  # fmt: skip
    tuning_peak = _peak_gib(device)
    if args.memory_trace:
        print(memory_trace.peak_breakdown(recorded["snapshot"], resident_before), flush=True)
        print(memory_trace.held_by(result, model, device), flush=True)
    if device == "cuda":
        _print_memory(result, tuning_peak, eager_peak, resident_before)
    print(result)
    print(_candidate_rows(result), flush=True)
    return result, tuning_peak


def _candidate_rows(result: Any) -> str:
    """Every candidate of every graph at the selected depth: why a winner won (or others lost)."""
    if result.depth is None:
        return "candidates: the model was left untuned"
    lines = [f"candidates at depth {result.depth} (* = winner)"]
    for graph in result.graphs.get(result.depth, []):
        lines.append(f"  {graph.path or '<model>'} {graph.graph.key}")
        for row in graph.rows:
            mark = "*" if row is graph.winner else " "
            lines.append(f"    {mark} {row.backend.name}: {row.describe()}, {row.latency_text()}")
    return "\n".join(lines)


def _print_memory(
    result: Any, tuning_peak: float | None, eager_peak: float | None, resident_before: int
) -> None:
    """CUDA: tuning's peak beside eager's, and what the tuned result holds."""
    captures, size = _static_bytes(result.model)
    resident = (torch.cuda.memory_allocated() - resident_before) / 2**30
    print(f"memory: peak while tuning {tuning_peak:.2f} GiB, eager generate {eager_peak:.2f} "
          f"GiB; held before tuning {resident_before / 2**30:.2f} GiB (the model and "
          f"what eager left); held after tuning {resident:.2f} GiB more, of which "
          f"{captures} captures' static inputs {size / 2**30:.2f} GiB")  # fmt: skip


def _slowdown_probe(
    model: Any,
    result: Any,
    unseen: dict[int, dict[str, Any]],
    tokens: int,
    args: argparse.Namespace,
    before: dict[int, float],
    objects_before: int,
) -> None:
    """Eager again right after tuning, nothing else compiled: is the untuned model slower, and why?

    Timed with the tuned result alive (collector on, then off), then with it undone and freed.
    """
    device, rounds = args.device, args.rounds

    def eager(label: str) -> None:
        ms = {b: round(t, 3) for b, t in _eager_ms(model, unseen, tokens, device, rounds).items()}
        ratio = {b: round(ms[b] / before[b], 3) for b in ms}
        print(f"slowdown probe: eager {label}: ms per new token {ms}, over before {ratio}; "
              f"{len(gc.get_objects())} objects tracked (before tuning {objects_before})",
              flush=True)  # fmt: skip

    eager("after tuning, result alive")
    gc.disable()
    try:
        eager("after tuning, result alive, collector off")
    finally:
        gc.enable()
    result.undo()
    del result
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    eager("after tuning, result undone and freed")


def _warm_static(
    model: Any,
    unseen: dict[int, dict[str, Any]],
    batches: list[int],
    tokens: int,
    device: str,
    setup: dict[str, float],
    approaches: dict[str, Any],
) -> None:
    """HF's static cache compiles its decode step on the first calls of each shape: warm it up."""
    _reset_peak(device)
    start = time.perf_counter()
    for b in batches:
        _static(tokens)(model, **unseen[b])
        _static(tokens)(model, **unseen[b])
    setup["hf static"] = time.perf_counter() - start
    peak = _peak_gib(device)
    if peak is not None:
        print(f"memory: peak while HF static warms up {peak:.2f} GiB", flush=True)
    approaches["hf static"] = model


def _time(
    model: Any,
    make: Callable[[int], Callable[..., Any]],
    prompt: dict[str, Any],
    tokens: int,
    device: str,
    rounds: int,
) -> dict[str, list[float]]:
    whole, first = make(tokens), make(1)
    calls = {"N": lambda: whole(model, **prompt), "1": lambda: first(model, **prompt)}
    times = _interleaved(calls, device, rounds)
    times["tokens"] = [float(tokens)]
    return times


def _per_token(times: dict[str, list[float]]) -> float:
    tokens = int(times["tokens"][0])
    whole, first = statistics.median(times["N"]), statistics.median(times["1"])
    return (whole - first) / max(1, tokens - 1) * 1e3


def _spread(times: dict[str, list[float]]) -> float:
    tokens = int(times["tokens"][0])
    whole = sorted(times["N"])
    return (whole[-1] - whole[0]) / max(1, tokens - 1) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--models", default="gpt2,llama")
    p.add_argument("--batches", default="1,4")
    p.add_argument("--lengths", default="16,64", help="tuning prompt lengths (per batch size)")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per generate call")
    p.add_argument("--budget", default="default", help="tunetree's time budget, s or 'default'")
    p.add_argument("--max-depth", type=int, default=None)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per approach")
    p.add_argument("--skip-static", action="store_true", help="leave out HF's static cache")
    p.add_argument(
        "--cache", default="static", choices=["static", "dynamic"],
        help="the cache tunetree's generate uses (static: HF's compile off)",
    )  # fmt: skip
    switches = {
        "--static-first": "warm HF's static cache up before tuning (the order of sessions 4, 5)",
        "--profile": "CUDA: profile one generate per approach (wall against GPU kernel time)",
        "--memory-trace": "CUDA: memory per tuning phase, and what is alive at the peak by the "
        "code behind it",
        "--slowdown-probe": "time eager right after tuning (result alive, collector off, result "
        "freed), then stop",
    }
    for flag, text in switches.items():
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="the model's own precision (built in it; eager in it is the reference)",
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.budget != "default":
        args.budget = float(args.budget)
    common.cuda_setup(args.device)
    header = common.header(common.command_line())
    builders = configs(args.device, args.quick)
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        rows += run(name, builders[name], args)
        if not rows:
            continue
        print(format_table(list(rows[0]), [list(r.values()) for r in rows], title="generate"))
        common.write_json(args.out, "generate.json", {"header": header, "rows": rows})


if __name__ == "__main__":
    main()
