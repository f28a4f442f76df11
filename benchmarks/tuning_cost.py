"""Tuning cost (issue 18): what tuning a model costs, side by side with torch.compile's first call.

    python -m benchmarks.tuning_cost --device cpu --out benchmarks/results/tuning-cost
    python -m benchmarks.tuning_cost --device cuda --models llama,t5-encoder,gpt2 --max-depth 1
    python -m benchmarks.tuning_cost --quick --models mlp --budget 20      # seconds: a smoke run

Per model, in one run: ``torch.compile``'s first pass (compiling and calling it on every sample;
measured last, so Inductor caches warmed by tunetree's builds favour torch.compile), each
default backend's build time alone (``tt.tune`` at depth 0 with that backend only), and
``tt.auto_tune``'s wall time with its default settings and with ``quick=True`` (``--with-old``
adds a run with the issue's savings switched off: no screening, no early stop, no budget, no
twins' narrowed races, and inspection recording inside layers on PyTorch's fused fast path, so
their submodules are tuned as before; ``--settings default`` runs the default one alone,
``--no-backend-builds`` skips the builds alone: both save device time; ``--cold-compile`` adds
torch.compile's first pass in a fresh process with empty Inductor and Triton caches, what a user
sees first), each with its per-phase breakdown and the depth it kept. Then eager, the compiled
model and every tuned model are measured end to end in one interleaved ``candidates.measure``
call, so the speed-ups are side-by- side ratios ("speed-up here"; beside OpenVINO or ONNX
Runtime runners in one process eager can be slowed many times over by their spinning thread
pools, so also compare auto_tune's own end- to-end ratio, measured beside the untuned model
only). The load average is printed before and after every model: a busy machine slows tuning and
moves every number. Models are built from configs with random weights (nothing is downloaded):
the encoder of ``make demo``, BERT-4L, the small CNN, GPT-2 prefill, and Llama, T5 encoder and
RoBERTa called with six different shapes. Results go to ``--out`` as JSON and markdown.
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
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tunetree as tt
from tunetree._util.table import format_table
from tunetree.candidates.budget import BUILD
from tunetree.candidates.measure import cycle_calls, measure
from tunetree.signature.graph import as_samples
from tunetree.signature.modules import run_model

from . import common
from .common import models

DEFAULT_MODELS = ["encoder", "bert", "cnn", "gpt2", "llama", "t5-encoder", "roberta"]
VARYING = {"llama", "t5-encoder", "roberta"}
"""Models called with six different (batch, sequence length) shapes."""


def progress(text: str, started: float) -> None:
    """One progress line on stderr with the time since the run started and the load."""
    print(
        f"[tuning_cost {time.perf_counter() - started:7.1f}s, {load()}] {text}",
        file=sys.stderr,
        flush=True,
    )


def load() -> str:
    """The 1-minute load average and the core count."""
    if not hasattr(os, "getloadavg"):
        return "load unknown"
    return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def _shapes(size: str) -> list[tuple[int, int]]:
    """Six (batch, sequence length) pairs of a varying workload."""
    if size == "quick":
        return [(1, 8), (2, 16), (1, 12), (2, 8), (1, 16), (2, 10)]
    if size == "cpu":
        return [(1, 17), (4, 64), (2, 33), (8, 128), (1, 100), (4, 48)]
    return [(1, 17), (8, 128), (4, 64), (16, 256), (2, 200), (8, 48)]


def _varying_tokens(vocab: int, size: str) -> list[dict[str, torch.Tensor]]:
    return [
        {
            "input_ids": torch.randint(0, vocab, (b, n)),
            "attention_mask": torch.ones(b, n, dtype=torch.long),
        }
        for b, n in _shapes(size)
    ]


def _hf(name: str, size: str) -> tuple[nn.Module, list[Any]]:
    """The Hugging Face models of the issue's table, from configs."""
    import transformers

    quick, cuda = size == "quick", size == "cuda"
    if name == "llama":
        width, layers = (64, 2) if quick else ((512, 4) if cuda else (128, 2))
        config = transformers.LlamaConfig(
            vocab_size=500 if quick else 32000,
            hidden_size=width,
            intermediate_size=width * 11 // 4,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
        return transformers.LlamaModel(config), _varying_tokens(config.vocab_size, size)
    if name == "t5-encoder":
        width, layers = (64, 2) if quick else (512, 6)
        t5 = transformers.T5Config(
            vocab_size=500 if quick else 32128,
            d_model=width,
            d_ff=4 * width,
            d_kv=width // 8,
            num_layers=layers,
            num_heads=8,
        )
        return transformers.T5EncoderModel(t5), _varying_tokens(t5.vocab_size, size)
    if name == "roberta":
        width = 64 if quick else 256
        roberta = transformers.RobertaConfig(
            vocab_size=500 if quick else 50265,
            hidden_size=width,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=4 * width,
            max_position_embeddings=520,
        )
        return transformers.RobertaModel(roberta), _varying_tokens(roberta.vocab_size, size)
    raise SystemExit(f"unknown model {name!r}")


def build(name: str, size: str, device: str) -> models.ZooModel:
    """Model ``name`` at ``size``, in eval mode on ``device``."""
    if name not in VARYING:
        return models.build(name, size, device)
    torch.manual_seed(0)
    model, data = _hf(name, size)
    data = [{k: v.to(device) for k, v in item.items()} for item in data]
    return models.ZooModel(name, model.eval().to(device), data, True)


def compile_first_pass(entry: models.ZooModel) -> tuple[Callable[..., Any] | None, float, str]:
    """``torch.compile``'s first pass: compile and call once on every sample.

    No ``torch._dynamo.reset()`` first: it would empty the compiled-code caches of the models
    auto_tune tuned a moment ago, and their ranged Inductor runners would then serve the
    end-to-end measurement with the original forward. The deep copy's compile starts from an
    empty cache of its own anyway (tunetree compiles fresh entry functions).
    """
    start = time.perf_counter()
    try:
        compiled = torch.compile(copy.deepcopy(entry.model))
        with torch.no_grad():
            for sample in as_samples(entry.data):
                run_model(compiled, sample, None)
    except Exception as exc:  # a compile failure is a row, not the end of the run
        return None, time.perf_counter() - start, f"failed: {type(exc).__name__}: {exc}"[:120]
    return common.caller(compiled), time.perf_counter() - start, ""


def cold_compile_s(name: str, args: Any) -> tuple[float | None, str]:
    """``torch.compile``'s first pass in a fresh process with empty Inductor and Triton caches.

    What a user sees the first time: nothing compiled before on the machine. The in-process
    first pass (measured after auto_tune) can reuse the graphs tunetree compiled a moment ago
    from Inductor's caches; this one cannot. Process start and imports are not counted.
    """
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"),
            "TRITON_CACHE_DIR": str(Path(tmp) / "triton"),
        }
        command = [sys.executable, "-m", "benchmarks.tuning_cost", "--compile-only"]
        command += ["--device", args.device, "--models", name]
        command += ["--quick"] if args.quick else []
        done = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
            check=False,
        )
    for line in done.stdout.splitlines():
        if line.startswith("COMPILE_ONLY "):
            row = json.loads(line.removeprefix("COMPILE_ONLY "))
            return row["seconds"], row["note"]
    return None, f"cold compile failed: {done.stderr.strip()[-200:]}"


def compile_only(args: Any) -> None:
    """The child of :func:`cold_compile_s`: one first pass per model, one JSON line each."""
    import json

    for name in args.models.split(","):
        entry = build(name, common.size_for(args), args.device)
        _, seconds, note = compile_first_pass(entry)
        print("COMPILE_ONLY " + json.dumps({"model": name, "seconds": seconds, "note": note}))


def backend_builds(entry: models.ZooModel, device: str) -> list[dict[str, Any]]:
    """Each default backend alone at depth 0: its build time and its tune's wall time."""
    rows = []
    for backend in tt.default_strategy(device).backends:
        if backend.kind == "eager":
            continue
        start = time.perf_counter()
        try:
            result = tt.tune(
                copy.deepcopy(entry.model),
                entry.data,
                depth=0,
                strategy=tt.OneBackendStrategy(backend),
                measure_config=tt.MeasureConfig.quick(),
                verbose=False,
                cache=False,  # cold: the build is what is measured
            )
        except Exception as exc:
            rows.append({"backend": backend.name, "note": f"{type(exc).__name__}: {exc}"[:120]})
            continue
        breakdown = result.breakdown
        graph_rows = [r for g in result.graphs for r in g.rows]
        rows.append(
            {
                "backend": backend.name,
                "build_s": breakdown.seconds(BUILD, backend.kind) if breakdown else None,
                "tune_s": time.perf_counter() - start,
                "graphs": len(result.graphs),
                "note": "; ".join(sorted({r.describe()[:80] for r in graph_rows if r.reason})),
            }
        )
    return rows


@contextlib.contextmanager
def _fast_paths_unknown() -> Iterator[None]:
    """Inspection as before fused fast paths were found: it records inside fused layers, so
    auto_tune tunes their submodules too (a depth the tuned model never runs)."""
    from unittest import mock

    from tunetree.signature import inspection

    def first_call(model: Any, sample: Any, call: Any) -> dict[str, str]:
        inspection.run_model(model, sample, call)
        return {}

    with mock.patch.object(inspection, "_first_call", first_call):
        yield


def auto_runs(entry: models.ZooModel, args: Any) -> dict[str, tuple[Any, dict[str, Any]]]:
    """``tt.auto_tune`` cold, per setting: the tuned model and what the run cost."""
    settings: dict[str, dict[str, Any]] = {}
    if "default" in args.settings:
        settings["auto_tune"] = {}
    if "quick" in args.settings:
        settings["auto_tune quick"] = {"quick": True}
    if args.with_old:
        every = tt.default_strategy(args.device).backends
        settings["auto_tune savings off"] = {
            "measure_config": tt.MeasureConfig(screen=False, stop_when_clear=False),
            "time_budget": None,
            "strategy": tt.HighestThroughputStrategy(every, share_twins=False),
        }
    runs = {}
    for label, kw in settings.items():
        kw.setdefault("time_budget", "default" if args.budget is None else args.budget)
        if args.max_depth is not None:
            kw["max_depth"] = args.max_depth
        start = time.perf_counter()
        with _fast_paths_unknown() if label.endswith("savings off") else contextlib.nullcontext():
            result = tt.auto_tune(
                copy.deepcopy(entry.model), entry.data, verbose=False, cache=False, **kw
            )
        wall = time.perf_counter() - start
        print(f"\n### {entry.name}: {label}\n{result}", flush=True)
        runs[label] = (
            result.model,
            {
                "wall_s": wall,
                "depth": result.depth,
                "speedup_measured_by_auto_tune": result.speedup,
                "time_budget": result.time_budget,
                "skipped": len(result.skipped()),
                "breakdown": result.breakdown.to_json() if result.breakdown else None,
            },
        )
    return runs


def run(name: str, args: Any, started: float) -> dict[str, Any]:
    """Every approach for one model, then one interleaved end-to-end measurement."""
    size = common.size_for(args)
    entry = build(name, size, args.device)
    load_before = load()
    # tunetree first, torch.compile last: Inductor's on-disk caches warmed by tunetree's
    # Inductor builds can only make torch.compile's first pass look cheaper, never tunetree.
    cold_s, cold_note = None, ""
    if args.cold_compile:
        progress(f"{name}: torch.compile first pass, cold, in a fresh process", started)
        cold_s, cold_note = cold_compile_s(name, args)
    progress(f"{name}: tt.auto_tune", started)
    autos = auto_runs(entry, args)
    builds: list[dict[str, Any]] = []
    if not args.no_backend_builds:
        progress(f"{name}: each default backend alone", started)
        builds = backend_builds(entry, args.device)
    progress(f"{name}: torch.compile first pass", started)
    compiled, compile_s, compile_note = compile_first_pass(entry)
    calls: dict[str, Callable[..., Any]] = {"eager": common.caller(entry.model)}
    if compiled is not None:
        calls["torch.compile"] = compiled
    calls.update({label: common.caller(model) for label, (model, _) in autos.items()})
    progress(f"{name}: measuring every approach end to end", started)
    samples = as_samples(entry.data)
    config = tt.MeasureConfig.quick() if args.quick else tt.MeasureConfig()
    timings = measure({k: cycle_calls(fn, samples) for k, fn in calls.items()}, args.device, config)
    eager = timings["eager"].median_s
    approaches = [
        {
            "approach": "torch.compile",
            "cost_s": compile_s,
            "speedup": eager / timings["torch.compile"].median_s if compiled else None,
            "note": compile_note,
        }
    ]
    if args.cold_compile:
        approaches.append(
            {
                "approach": "torch.compile cold",
                "cost_s": cold_s,
                "speedup": None,
                "note": cold_note or "fresh process, empty Inductor and Triton caches",
            }
        )
    for label, (_, info) in autos.items():
        approaches.append(
            {
                "approach": label,
                "cost_s": info["wall_s"],
                "speedup": eager / timings[label].median_s,
                "vs_compile_cost": info["wall_s"] / compile_s if compile_s else None,
                "vs_cold_compile_cost": info["wall_s"] / cold_s if cold_s else None,
                **info,
            }
        )
    return {
        "model": name,
        "load_before": load_before,
        "load_after": load(),
        "eager_ms": eager * 1e3,
        "approaches": approaches,
        "backend_builds": builds,
    }


def print_model(result: dict[str, Any]) -> None:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    print(f"\n## {result['model']} ({result['load_before']} -> {result['load_after']})")
    print(
        format_table(
            [
                "approach",
                "cost s",
                "x compile cost",
                "x cold compile",
                "speed-up here",
                "auto_tune's own",
                "depth",
                "skipped",
                "note",
            ],
            [
                [
                    a["approach"],
                    f(a.get("cost_s"), ".1f"),
                    f(a.get("vs_compile_cost"), ".2f"),
                    f(a.get("vs_cold_compile_cost"), ".2f"),
                    f(a.get("speedup"), ".2f"),
                    f(a.get("speedup_measured_by_auto_tune"), ".2f"),
                    "-" if a.get("depth") is None else a["depth"],
                    a.get("skipped", "-"),
                    a.get("note", ""),
                ]
                for a in result["approaches"]
            ],
        )
    )
    print(
        format_table(
            ["backend alone", "build s", "tune s", "graphs", "note"],
            [
                [
                    b["backend"],
                    f(b.get("build_s"), ".2f"),
                    f(b.get("tune_s"), ".2f"),
                    b.get("graphs", "-"),
                    b.get("note", ""),
                ]
                for b in result["backend_builds"]
            ],
        ),
        flush=True,
    )


def markdown(payload: dict[str, Any]) -> str:
    """One table per run: cost and speed-up per model and approach, and the largest phases."""
    run = payload["run"]
    lines = [
        "# Tuning cost",
        "",
        f"{run['date']}, `{run['command']}`, torch {run['torch']}, {run['cpu_count']} CPUs, "
        f"GPU {run['gpu']}, load average {run['load_average_1m']}",
        "",
        "| model | approach | cost s | x torch.compile | x cold compile | speed-up | depth "
        "| largest phases |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in payload["results"]:
        for a in result["approaches"]:
            phases = (a.get("breakdown") or {}).get("phases", [])
            top = sorted(phases, key=lambda p: -p["seconds"])[:3]
            text = ", ".join(
                f"{p['phase']}{' ' + p['detail'] if p['detail'] else ''} {p['seconds']:.1f} s"
                for p in top
            )
            cost, speedup, depth = a.get("vs_compile_cost"), a.get("speedup"), a.get("depth")
            cold = a.get("vs_cold_compile_cost")
            cells = [
                result["model"],
                a["approach"],
                "-" if a["cost_s"] is None else f"{a['cost_s']:.1f}",
                "-" if cost is None else f"{cost:.2f}",
                "-" if cold is None else f"{cold:.2f}",
                "-" if speedup is None else f"{speedup:.2f}x",
                "-" if depth is None else str(depth),
                text,
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = common.parser(__doc__ or "", DEFAULT_MODELS)
    p.add_argument("--max-depth", type=int, default=None, help="auto_tune's max_depth")
    p.add_argument(
        "--budget", type=float, default=None, help="auto_tune's time budget (default: its own)"
    )
    p.add_argument(
        "--with-old",
        action="store_true",
        help="also auto_tune with the savings off (no screening, early stop, budget, twins, "
        "fused fast-path leaves)",
    )
    p.add_argument(
        "--settings",
        default="default,quick",
        help="comma-separated auto_tune settings to run: default, quick (default: both)",
    )
    p.add_argument(
        "--no-backend-builds",
        action="store_true",
        help="skip timing each default backend's build alone (saves device time)",
    )
    p.add_argument(
        "--cold-compile",
        action="store_true",
        help="also time torch.compile's first pass in a fresh process with empty caches",
    )
    p.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.compile_only:
        common.cuda_setup(args.device)
        compile_only(args)
        return
    args.settings = set(args.settings.split(","))
    if not args.settings <= {"default", "quick"}:
        p.error(f"--settings takes default and/or quick, not {sorted(args.settings)}")
    common.cuda_setup(args.device)
    info = common.header(common.command_line())
    results, failed = [], []
    started = time.perf_counter()
    for name in args.models.split(","):
        try:
            result = run(name, args, started)
        except Exception as exc:  # one broken model must not lose the others' numbers
            print(f"\n## {name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            failed.append(name)
            continue
        print_model(result)
        results.append(result)
        payload = {"run": info, "results": results, "failed": failed}
        common.write_json(args.out, f"tuning-cost-{args.device}.json", payload)
        if args.out is not None:
            path = Path(args.out) / f"tuning-cost-{args.device}.md"
            path.write_text(markdown(payload))
    print(f"\n# load average at the end: {load()}")


if __name__ == "__main__":
    main()
