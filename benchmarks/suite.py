"""The benchmark suite: eager, torch.compile, every single backend and auto_tune, side by side.

    python -m benchmarks.suite --device cpu --out out/bench            # the CPU zoo
    python -m benchmarks.suite --device cuda --out out/bench-cuda      # on a GPU machine
    python -m benchmarks.suite --quick --models mlp,encoder            # seconds: the CI guard

``--quick`` also caps auto_tune (max_depth 1, a 10 s time budget per model, unless given),
because its per-graph builds dominate a quick run; a progress line per model and phase goes
to stderr.

For each model every approach is built first (its build/tuning time recorded), then all
of them are measured end to end in one interleaved ``candidates.measure`` call, so every
ratio compares numbers taken in the same run under the same conditions. See
benchmarks/README.md for the method.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import tunetree as tt
from tunetree._util.table import format_table
from tunetree.candidates.measure import cycle_calls, measure
from tunetree.signature.graph import as_samples
from tunetree.signature.modules import run_model

from . import common
from .common import models

QUICK_AUTO_BUDGET_S = 10.0
"""auto_tune's time budget per model in ``--quick`` runs."""


def progress(text: str, started: float) -> None:
    """One progress line on stderr with the time since the run started."""
    print(f"[suite {time.perf_counter() - started:6.1f}s] {text}", file=sys.stderr, flush=True)


DEFAULT_MODELS = ["mlp", "encoder", "cnn", "resnet", "bert", "distilbert", "gpt2", "vit"]


def peak_flops(device: str) -> float:
    """Achieved fp32 FLOP/s of a large matmul on this machine, measured now."""
    n = 8192 if device == "cuda" else 1024
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    t = measure({"mm": lambda: a @ b}, device, tt.MeasureConfig(max_s_per_candidate=1.0))["mm"]
    return 2 * n**3 / t.median_s


def model_flops(model: Any, data: list[Any]) -> float | None:
    """FLOPs of one eager call (matmuls and convolutions), or None when not countable."""
    from torch.utils.flop_counter import FlopCounterMode

    sample = as_samples(data)[0]
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            run_model(model, sample, None)
        return float(counter.get_total_flops())
    except Exception:
        return None


def build_approaches(
    entry: models.ZooModel, device: str, config: tt.MeasureConfig, options: Any
) -> tuple[dict[str, Callable[..., Any]], dict[str, float], dict[str, str]]:
    """Every approach's callable, its build time, and a note (failures)."""
    import copy

    calls: dict[str, Callable[..., Any]] = {"eager": common.caller(entry.model)}
    build_s: dict[str, float] = {"eager": 0.0}
    notes: dict[str, str] = {}
    samples = as_samples(entry.data)

    model_start = time.perf_counter()

    def compiled(name: str, **kw: Any) -> None:
        progress(f"  {entry.name}: {name}", model_start)
        start = time.perf_counter()
        try:
            fn = torch.compile(copy.deepcopy(entry.model), **kw)
            with torch.no_grad():
                for s in samples:
                    fn(*s.args, **s.kwargs)
            calls[name] = common.caller(fn)
        except Exception as exc:
            notes[name] = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
        build_s[name] = time.perf_counter() - start

    compiled("torch.compile")
    if device == "cuda" and options.max_autotune:
        compiled("torch.compile max-autotune", mode="max-autotune")

    for backend in tt.default_strategy(device).backends:
        if backend.kind == "eager":
            continue
        name = f"tt {backend.name} (depth 0)"
        progress(f"  {entry.name}: {name}", model_start)
        start = time.perf_counter()
        result = tt.tune(
            copy.deepcopy(entry.model),
            entry.data,
            depth=0,
            strategy=tt.OneBackendStrategy(backend),
            measure_config=tt.MeasureConfig.quick(),
            verbose=False,
            cache=False,  # cold tuning: build times are part of the result
        )
        build_s[name] = time.perf_counter() - start
        winner = result.graphs[0].winner
        if winner is None:
            notes[name] = result.graphs[0].rows[0].describe()[:100]
        else:
            calls[name] = common.caller(result.model)

    progress(f"  {entry.name}: tt.auto_tune", model_start)
    start = time.perf_counter()
    auto = tt.auto_tune(
        copy.deepcopy(entry.model),
        entry.data,
        max_depth=options.auto_max_depth,
        time_budget=options.auto_time_budget,
        measure_config=config,
        verbose=False,
        cache=False,  # cold tuning: build times are part of the result
    )
    build_s["tt.auto_tune"] = time.perf_counter() - start
    calls["tt.auto_tune"] = common.caller(auto.model)
    notes["tt.auto_tune"] = f"depth {auto.depth}" if auto.depth is not None else "left untuned"
    return calls, build_s, notes


def run(
    name: str, size: str, device: str, config: tt.MeasureConfig, peak: float, options: Any
) -> dict[str, Any]:
    entry = models.build(name, size, device)
    calls, build_s, notes = build_approaches(entry, device, config, options)
    samples = as_samples(entry.data)
    timings = measure({k: cycle_calls(fn, samples) for k, fn in calls.items()}, device, config)
    memory: dict[str, float] = {}
    if device == "cuda":
        for k, fn in calls.items():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                fn(*samples[0].args, **samples[0].kwargs)
            torch.cuda.synchronize()
            memory[k] = torch.cuda.max_memory_allocated() / 2**20
    flops = model_flops(entry.model, entry.data) if entry.matmul_heavy else None
    eager = timings["eager"].median_s
    compiled = timings.get("torch.compile")
    rows = []
    for k, t in timings.items():
        rows.append(
            {
                "approach": k,
                "median_ms": t.median_s * 1e3,
                "spread_pct": 100 * t.spread,
                "vs_eager": eager / t.median_s,
                "vs_compile": compiled.median_s / t.median_s if compiled else None,
                "build_s": build_s.get(k),
                "peak_mib": memory.get(k),
                "tflops": flops / t.median_s / 1e12 if flops else None,
                "pct_of_peak": 100 * flops / t.median_s / peak if flops else None,
                "note": notes.get(k, ""),
            }
        )
    for k, note in notes.items():
        if k not in timings:
            rows.append({"approach": k, "note": note})
    return {"model": name, "flops_per_call": flops, "rows": rows}


def print_model(result: dict[str, Any]) -> None:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    print(f"\n## {result['model']}", flush=True)
    print(
        format_table(
            [
                "approach",
                "median ms",
                "spread",
                "vs eager",
                "vs compile",
                "build s",
                "peak MiB",
                "TFLOP/s",
                "% peak",
                "note",
            ],
            [
                [
                    r["approach"],
                    f(r.get("median_ms"), ".4g"),
                    "-" if r.get("spread_pct") is None else f"±{r['spread_pct'] / 2:.1f}%",
                    f(r.get("vs_eager"), ".2f"),
                    f(r.get("vs_compile"), ".2f"),
                    f(r.get("build_s"), ".1f"),
                    f(r.get("peak_mib"), ".0f"),
                    f(r.get("tflops"), ".3g"),
                    f(r.get("pct_of_peak"), ".0f"),
                    r.get("note", ""),
                ]
                for r in result["rows"]
            ],
        )
    )


def plot(results: list[dict[str, Any]], path: Any) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no chart (pip install 'tunetree[plot]')")
        return
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 4), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        rows = [r for r in result["rows"] if r.get("vs_eager")]
        ax.barh([r["approach"] for r in rows], [r["vs_eager"] for r in rows])
        ax.axvline(1.0, color="grey", linewidth=1)
        ax.set_title(result["model"])
        ax.set_xlabel("speed-up vs eager (higher is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    print(f"wrote {path}")


def main() -> None:
    p = common.parser(__doc__ or "", DEFAULT_MODELS)
    p.add_argument("--auto-max-depth", type=int, default=None, help="auto_tune's max_depth")
    p.add_argument("--auto-time-budget", type=float, default=None, help="auto_tune's budget (s)")
    p.add_argument(
        "--no-max-autotune",
        dest="max_autotune",
        action="store_false",
        help="skip torch.compile(mode='max-autotune') on CUDA (its compiles take minutes)",
    )
    args = p.parse_args()
    common.cuda_setup(args.device)
    info = common.header(common.command_line())
    config = tt.MeasureConfig.quick() if args.quick else tt.MeasureConfig()
    peak = peak_flops(args.device)
    info["peak_tflops_fp32_matmul"] = peak / 1e12
    print(f"# measured fp32 matmul peak: {peak / 1e12:.3g} TFLOP/s")
    results = []
    failed = []
    if args.quick:
        args.auto_max_depth = 1 if args.auto_max_depth is None else args.auto_max_depth
        args.auto_time_budget = args.auto_time_budget or QUICK_AUTO_BUDGET_S
    names = args.models.split(",")
    started = time.perf_counter()
    for index, name in enumerate(names):
        progress(f"[{index + 1}/{len(names)}] {name}", started)
        try:
            result = run(name, common.size_for(args), args.device, config, peak, args)
        except Exception as exc:  # one broken model must not lose the others' numbers
            print(f"\n## {name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            failed.append(name)
            continue
        print_model(result)
        results.append(result)
        # Written after every model, so a run cut short still leaves its results.
        payload = {"run": info, "results": results, "failed": failed}
        common.write_json(args.out, f"suite-{args.device}.json", payload)
    if args.out is not None and results:
        plot(results, args.out / f"suite-{args.device}.png")


if __name__ == "__main__":
    main()
