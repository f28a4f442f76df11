"""tt.jit on live traffic beside eager and auto_tune, and the warm start of a second process.

Run: ``python benchmarks/jit.py`` (BERT-base from its config, 12 layers h768, on the CPU;
``--model small`` for a 4-layer h256 BERT to try it quickly). One process:

1. **eager**: the traffic trace (``--calls`` calls, batch 1-8, sequence 16-128, seeded) on the
   model itself, every call timed.
2. **while tuning**: ``tt.jit(model, cache=DIR)`` served the trace in a loop in one thread,
   back to back (``--duty 1``) or idle between calls (``--duty 0.5``: busy half the time),
   until the swap: the median and worst call latency while recording and tuning, and the
   worst time a call took beyond its own eager time (goal: median at most 2x eager's, no
   call blocked more than 1 s).
3. **after the swap** and **auto_tune on the same calls**: ``served`` and
   ``tt.auto_tune(model, <the calls tt.jit tuned on>)`` (its own empty cache) timed side by
   side on the trace, passes alternating in every order (goal: within 5 %).
4. **warm second process**: a fresh interpreter with the same model and cache: seconds from
   ``tt.jit(...)`` to the first call the tuned plan served (calls go on eagerly meanwhile;
   a call after the swap but outside the plan's ranges runs the original forward and does
   not count), and the backend builds it made (goal: at most 5 s, 0 builds).

Prints one table and the load average before and after; ``--json`` writes the numbers. Only
ratios measured in one run mean anything; on a shared machine note the load. To time the warm
start alone: ``--no-compare`` skips step 3, ``--backends onnxruntime --max-depth 1`` makes the
cold tune short, ``--warm-log FILE`` keeps the second process's DEBUG log (every cache lookup,
miss, load and build).
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def build(name: str) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "mlp":  # DESIGN.md's MLP 4x1024
        layers: list[torch.nn.Module] = []
        for _ in range(4):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers).eval()
    if name == "small":  # the BERT-4L h256 of DESIGN.md's tables
        config = transformers.BertConfig(
            num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024
        )
    else:
        config = transformers.BertConfig()  # BERT-base: 12 layers, h768, 110M parameters
    return transformers.BertModel(config).eval()


def trace(count: int, seed: int = 0, model: str = "base") -> list[dict[str, Any]]:
    """``count`` calls with batch 1-8 and sequence 16-128, a padded mask on some.

    For the MLP: ``{"input": x}`` with batch 1-32.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    if model == "mlp":
        sizes = torch.randint(1, 33, (count,), generator=g).tolist()
        return [{"input": torch.randn(b, 1024, generator=g)} for b in sizes]
    calls = []
    for _ in range(count):
        batch = int(torch.randint(1, 9, (1,), generator=g))
        seq = int(torch.randint(16, 129, (1,), generator=g))
        ids = torch.randint(0, 30000, (batch, seq), generator=g)
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[0, seq // 2 :] = 0
        calls.append({"input_ids": ids, "attention_mask": mask})
    return calls


def counting_builds() -> list[str]:
    """Count every backend build of this process (by backend kind)."""
    from tunetree.backends import BACKEND_TYPES

    builds: list[str] = []
    for cls in BACKEND_TYPES:
        original = cls.build

        def counting(self: Any, *a: Any, _original: Any = original, **k: Any) -> Any:
            builds.append(self.kind)
            return _original(self, *a, **k)

        cls.build = counting  # type: ignore[method-assign]
    return builds


class Stamps:
    """The time and text of every ``tunetree`` log record (to tell what a slow call overlapped)."""

    def __init__(self) -> None:
        self.records: list[tuple[float, str]] = []

    def last_before(self, when: float, origin: float) -> str:
        """The last record logged before ``when``, with its time since ``origin``."""
        before = [(t, m) for t, m in self.records if t <= when]
        return f"[+{before[-1][0] - origin:.1f} s] {before[-1][1]}" if before else "-"


def log_stamps() -> Stamps:
    """Record every ``tunetree`` log record (DEBUG and up) with its ``perf_counter`` time."""
    import logging

    stamps = Stamps()

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            stamps.records.append((time.perf_counter(), record.getMessage()[:120]))

    logger = logging.getLogger("tunetree")
    logger.addHandler(Handler(logging.DEBUG))
    logger.setLevel(logging.DEBUG)
    return stamps


def timed(fn: Any, calls: list[dict[str, Any]]) -> list[float]:
    import torch

    out = []
    with torch.no_grad():
        for call in calls:
            start = time.perf_counter()
            fn(**call)
            out.append(time.perf_counter() - start)
    return out


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The auto_tune options of every tune here (the warm second process passes the same)."""
    import tunetree as tt

    chosen: dict[str, Any] = {"time_budget": args.time_budget}
    if args.max_depth is not None:
        chosen["max_depth"] = args.max_depth
    if args.backends:  # fewer candidates: a shorter cold tune, e.g. to time a warm start
        kinds = {"onnxruntime": tt.backends.OnnxRuntime, "openvino": tt.backends.OpenVINO}
        chosen["strategy"] = tt.MinLatencyStrategy(
            [kinds[k]() for k in args.backends.split(",")] + [tt.backends.Eager()]
        )
    return chosen


def child(args: argparse.Namespace) -> None:
    """The warm second process: time from tt.jit(...) to the first call served tuned."""
    import torch

    import tunetree as tt

    builds = counting_builds()
    if args.warm_log:  # every cache lookup, miss, load and build of the warm start, at DEBUG
        import logging

        handler = logging.FileHandler(args.warm_log, mode="w")
        handler.setFormatter(logging.Formatter("%(relativeCreated)8.0f %(name)s %(message)s"))
        logging.getLogger("tunetree").addHandler(handler)
        logging.getLogger("tunetree").setLevel(logging.DEBUG)
    model = build(args.model)
    calls = trace(args.calls, seed=1, model=args.model)
    start = time.perf_counter()
    served = tt.jit(model, cache=args.cache, **options(args))
    first_tuned = swapped = None
    served_eager = outside = 0
    with torch.no_grad():
        for call in itertools.cycle(calls):
            tuned = served.status == "tuned"
            before = fallbacks(served)
            served(**call)
            if tuned and fallbacks(served) == before:  # a call the plan served, not one
                first_tuned = time.perf_counter() - start  # outside its ranges
                break
            if tuned:
                swapped = swapped or time.perf_counter() - start
                outside += 1
            else:
                served_eager += 1
            if served.status == "untuned" or time.perf_counter() - start > args.child_limit:
                break
    print(
        json.dumps(
            {
                "first_tuned_s": first_tuned,
                "eager_calls_before": served_eager,
                "first_call_after_swap_s": swapped,
                "outside_calls_before": outside,
                "builds": max(len(builds), served.builds),  # a child's builds count too
                "builds_here": len(builds),
                "status": served.status,
                "reason": served.reason,
                "phases": phases(served.result),
                "load": os.getloadavg()[0],
            }
        ),
        flush=True,
    )


def fallbacks(served: Any) -> int:
    """Calls the served plan ran with the original forward (outside its ranges) so far."""
    from tunetree.live.served import Watch  # how tt.jit itself counts them

    result = served.result
    return 0 if result is None else Watch(result.model).fallbacks()


def phases(result: Any) -> str:
    """The warm tune's largest phases, e.g. ``inspection 1.2 s, cache 0.8 s``."""
    if result is None or result.breakdown is None:
        return ""
    top = sorted(result.breakdown.phases, key=lambda p: -p.seconds)[:4]
    return ", ".join(f"{p.label} {p.seconds:.1f} s" for p in top)


def side_by_side(models: dict[str, Any], calls: list[dict[str, Any]], rounds: int) -> dict:
    """Mean seconds per call of each model over the trace, passes in every order."""
    per: dict[str, list[float]] = {name: [] for name in models}
    orders = list(itertools.permutations(models))
    for r in range(rounds):
        for name in orders[r % len(orders)]:
            per[name].append(statistics.fmean(timed(models[name], calls)))
    return {name: statistics.median(v) for name, v in per.items()}


def main(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import tunetree as tt

    cache = args.cache or tempfile.mkdtemp(prefix="tt-jit-bench-")
    load_before = os.getloadavg()[0]
    model = build(args.model)
    calls = trace(args.calls, model=args.model)
    timed(model, calls[:2])  # warm-up
    eager = timed(model, calls)
    own = [min(a, b) for a, b in zip(eager, timed(model, calls), strict=True)]
    """Each call's own eager time (the faster of two passes): what a call while tuning adds."""
    stamps = log_stamps()
    served = tt.jit(model, cache=cache, tuner_nice=args.nice, **options(args))
    while_tuning: list[float] = []
    started: list[float] = []  # when each call while tuning began
    threads_seen: set[int] = set()  # torch's intra-op threads as serving sees them
    start = time.perf_counter()
    added: list[float] = []  # each call's latency beyond its own eager time
    for index, call in itertools.cycle(enumerate(calls)):
        if served.status in ("tuned", "untuned"):
            break
        threads_seen.add(torch.get_num_threads())
        started.append(time.perf_counter())
        took = timed(served, [call])[0]
        while_tuning.append(took)
        added.append(took - own[index])
        if args.duty < 1.0:  # idle between calls: the service is busy ``duty`` of the time
            time.sleep(took * (1.0 - args.duty) / args.duty)
    tuned_after_s = time.perf_counter() - start
    first_reason = served.reason
    for _ in range(
        0 if args.no_compare else 3
    ):  # calls outside the first ranges start a re-tune once 8 of them ran
        timed(served, calls)
        served.wait(timeout=args.time_budget * 3)  # let it end before anything is timed
    if served.status != "tuned":
        print(f"left untuned: {served.reason}")
    served.wait(timeout=args.time_budget * 3)  # the calls kept for the warm start
    samples = served.tuned_on or served.recorder.samples()
    means: dict[str, float] = {}
    auto_depth = None
    if not args.no_compare:
        auto = tt.auto_tune(
            build(args.model),
            samples,
            cache=tempfile.mkdtemp(prefix="tt-jit-auto-"),
            verbose=False,
            **options(args),
        )
        auto_depth = auto.depth
        means = side_by_side(
            {"eager": model, "jit": served, "auto_tune": auto.model}, calls, args.rounds
        )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, __file__, "--child", "--model", args.model, "--cache", cache]
    command += ["--calls", str(args.calls), "--time-budget", str(args.time_budget)]
    command += ["--backends", args.backends, "--warm-log", args.warm_log]
    command += [] if args.max_depth is None else ["--max-depth", str(args.max_depth)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    warm = json.loads(done.stdout.strip().splitlines()[-1])
    report = {
        "model": args.model,
        "calls": args.calls,
        "eager_median_ms": 1e3 * statistics.median(eager),
        "eager_worst_ms": 1e3 * max(eager),
        "tuning_calls": len(while_tuning),
        "tuning_median_ms": 1e3 * statistics.median(while_tuning) if while_tuning else None,
        "tuning_worst_ms": 1e3 * max(while_tuning) if while_tuning else None,
        "tuning_added_worst_ms": 1e3 * max(added) if added else None,
        "tuning_added_p99_ms": 1e3 * sorted(added)[int(0.99 * len(added))] if added else None,
        "duty": args.duty,
        "worst_calls": [
            {
                "at_s": started[i] - start,
                "added_ms": 1e3 * added[i],
                "last_log": stamps.last_before(started[i] + while_tuning[i], start),
            }
            for i in sorted(range(len(added)), key=lambda i: -added[i])[:5]
        ],
        "swap_after_s": tuned_after_s,
        "threads": torch.get_num_threads(),
        "threads_while_tuning": sorted(threads_seen),
        "jit_reason": first_reason,
        "jit_final_reason": served.reason,
        "jit_tunes": served.tunes,
        "jit_builds": served.builds,
        "nice": args.nice,
        "recorded_calls": len(samples),
        "mean_ms": {k: 1e3 * v for k, v in means.items()},
        "auto_tune_depth": auto_depth,
        "warm": warm,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    print_report(report)
    return report


def print_report(r: dict[str, Any]) -> None:
    mean = r["mean_ms"]
    shape = "batch 1-32" if r["model"] == "mlp" else "batch 1-8, seq 16-128"
    busy = "back to back" if r["duty"] >= 1.0 else f"busy {r['duty']:.0%} of the time"
    print(f"tt.jit on {r['model']}, {r['calls']}-call trace ({shape}), served {busy}")
    print(
        f"load average {r['load_before']:.2f} before, {r['load_after']:.2f} after; torch "
        f"threads {r['threads']}, seen while tuning {r['threads_while_tuning']}"
    )
    print(
        f"eager                  median {r['eager_median_ms']:.1f} ms, worst "
        f"{r['eager_worst_ms']:.1f} ms per call"
    )
    if r["tuning_median_ms"] is not None:
        print(
            f"tt.jit while tuning    median {r['tuning_median_ms']:.1f} ms "
            f"({r['tuning_median_ms'] / r['eager_median_ms']:.2f}x eager), worst "
            f"{r['tuning_worst_ms']:.1f} ms, over {r['tuning_calls']} calls; swap after "
            f"{r['swap_after_s']:.1f} s ({r['jit_reason']})"
        )
        print(
            f"                       beyond each call's own eager time: worst "
            f"{r['tuning_added_worst_ms']:.1f} ms, p99 {r['tuning_added_p99_ms']:.1f} ms"
        )
        for w in r["worst_calls"]:
            print(
                f"                       +{w['added_ms']:.0f} ms at +{w['at_s']:.1f} s, "
                f"after: {w['last_log']}"
            )
    print(f"after more passes      {r['jit_tunes']} tunes: {r['jit_final_reason']}")
    if not mean:
        print("side by side           not run (--no-compare)")
    else:
        print(
            f"side by side (mean per call over the trace): eager {mean['eager']:.1f} ms, "
            f"tt.jit after swap {mean['jit']:.1f} ms ({mean['eager'] / mean['jit']:.2f}x eager), "
            f"auto_tune on the same {r['recorded_calls']} calls {mean['auto_tune']:.1f} ms "
            f"({mean['eager'] / mean['auto_tune']:.2f}x eager, depth {r['auto_tune_depth']}); "
            f"jit / auto_tune {mean['jit'] / mean['auto_tune']:.3f}"
        )
    w = r["warm"]
    first = "never" if w["first_tuned_s"] is None else f"{w['first_tuned_s']:.2f} s"
    print(
        f"warm second process    first tuned call {first} after tt.jit(...), "
        f"{w['eager_calls_before']} eager calls before it, {w['builds']} builds "
        f"({w['reason']}; load {w['load']:.2f})"
    )
    if w.get("outside_calls_before"):
        print(
            f"                       swapped at {w['first_call_after_swap_s']:.2f} s; "
            f"{w['outside_calls_before']} calls after it were outside the plan's ranges "
            "(the original forward)"
        )
    print(f"                       its tune's largest phases: {w['phases']}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["base", "small", "mlp"], default="base")
    parser.add_argument("--calls", type=int, default=24, help="calls in the traffic trace")
    parser.add_argument("--rounds", type=int, default=6, help="side-by-side passes")
    parser.add_argument("--time-budget", type=float, default=300.0)
    parser.add_argument(
        "--backends",
        default="",
        help="candidates besides eager, comma-separated (onnxruntime, openvino; default: "
        "the default strategy)",
    )
    parser.add_argument("--max-depth", type=int, default=None, help="auto_tune's max_depth")
    parser.add_argument(
        "--warm-log", default="", help="the warm second process's tunetree log (DEBUG) goes here"
    )
    parser.add_argument("--nice", type=int, default=10, help="tt.jit's tuner_nice")
    parser.add_argument(
        "--duty",
        type=float,
        default=1.0,
        help="share of the time the service is busy while tuning (1: calls back to back; "
        "0.5: after each call, idle as long as it took)",
    )
    parser.add_argument("--cache", default="", help="tuning cache directory (default: fresh)")
    parser.add_argument("--json", default="", help="write the numbers here")
    parser.add_argument(
        "--no-compare",
        action="store_true",
        help="skip the passes after the swap and the side by side with auto_tune (the "
        "warm second process follows the swap and the keeping of its calls)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-limit", type=float, default=600.0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    if arguments.child:
        child(arguments)
    else:
        numbers = main(arguments)
        if arguments.json:
            Path(arguments.json).write_text(json.dumps(numbers, indent=2))
