"""Mixed runtimes in one plan (issue 11, problem 7): is a plan whose graphs run on several
runtimes slower end to end than its per-graph figures add up to?

    python -m benchmarks.investigations.mixed_runtimes --device cpu  # BERT-2L, depth 1
    python -m benchmarks.investigations.mixed_runtimes --quick  # seconds: a check

Tunes one depth of each model with Inductor, OpenVINO and ONNX Runtime (``--quick``: the
tiny models without Inductor), then measures, in one interleaved ``candidates.measure`` call,
the untuned model, the greedy plan (every graph's own winner) and the single-runtime plan
(every graph on the runtime that won most graphs, eager elsewhere): the two plans
``auto_tune`` now chooses between. Per plan it prints the sum of its per-graph latencies
and its end-to-end latency. Run it on an idle machine: runtimes' thread pools are what is
measured, and a neighbour process disturbs exactly that.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

from typing import Any

import torch

import tunetree as tt
from tunetree._util.progress import Progress
from tunetree._util.table import format_seconds, format_table
from tunetree.runtime.wrap import wrap
from tunetree.search.endtoend import UNTUNED, runtime_name, side_by_side, single_runtime_plan
from tunetree.search.tune import plan_from, tune_cut

from .. import common
from ..common import models

DEFAULT_MODELS = ["bert"]


def backends(quick: bool, device: str) -> list[tt.backends.Backend]:
    chosen: list[tt.backends.Backend] = [tt.backends.Eager()]
    if not quick:
        chosen.append(tt.backends.Inductor())
    chosen += [tt.backends.OpenVINO(), tt.backends.OnnxRuntime()]
    return [b for b in chosen if b.unavailable_reason(torch.device(device)) is None]


def run(name: str, args: Any, config: tt.MeasureConfig) -> dict[str, Any]:
    device, depth = args.device, args.depth
    entry = models.build(name, common.size_for(args), device)
    info = tt.inspect(entry.model, entry.data, device=device)
    results = tune_cut(
        entry.model,
        info,
        depth,
        strategy=tt.MinLatencyStrategy(backends(args.quick, device)),
        tolerances=tt.Tolerances(),
        measure_config=config,
        progress=Progress(True),
    )
    plans = {"greedy": plan_from(results, depth)}
    single = single_runtime_plan(results, depth)
    if single is not None:
        plans["single-runtime"] = single
    tuned = {UNTUNED: entry.model}
    tuned.update({k: wrap(entry.model, p.runners(), in_place=False) for k, p in plans.items()})
    timings = side_by_side(tuned, info, None, config)
    untuned = timings[UNTUNED].median_s
    rows = []
    for key, timing in timings.items():
        plan = plans.get(key)
        summed = sum(e.latency_s or 0.0 for e in plan.entries) if plan else None
        rows.append(
            {
                "plan": key,
                "runtimes": runtime_name(plan) if plan else "-",
                "graphs_sum_ms": summed * 1e3 if summed else None,
                "end_to_end_ms": timing.median_s * 1e3,
                "spread_pct": 100 * timing.spread,
                "speedup": untuned / timing.median_s,
            }
        )
    return {"model": name, "depth": depth, "rows": rows, "one_runtime_won": single is None}


def print_result(result: dict[str, Any]) -> None:
    print(f"\n## {result['model']}, depth {result['depth']}")
    if result["one_runtime_won"]:
        print("one runtime won every graph: the greedy plan is already single-runtime")
    print(
        format_table(
            ["plan", "runtimes", "sum of graphs", "end to end", "spread", "speed-up"],
            [
                [
                    r["plan"],
                    r["runtimes"],
                    format_seconds(r["graphs_sum_ms"] / 1e3) if r["graphs_sum_ms"] else "-",
                    format_seconds(r["end_to_end_ms"] / 1e3),
                    f"±{r['spread_pct'] / 2:.1f}%",
                    f"{r['speedup']:.2f}x",
                ]
                for r in result["rows"]
            ],
        ),
        flush=True,
    )


def main() -> None:
    p = common.parser(__doc__ or "", DEFAULT_MODELS)
    p.add_argument("--depth", type=int, default=1, help="the cut depth compared (default 1)")
    args = p.parse_args()
    common.cuda_setup(args.device)
    info = common.header(common.command_line())
    config = tt.MeasureConfig.quick() if args.quick else tt.MeasureConfig()
    results = []
    for name in args.models.split(","):
        result = run(name, args, config)
        print_result(result)
        results.append(result)
        common.write_json(args.out, f"mixed-{args.device}.json", {"run": info, "results": results})


if __name__ == "__main__":
    main()
