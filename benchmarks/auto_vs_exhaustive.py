"""auto_tune against an exhaustive search over every (depth, backend) combination.

    python -m benchmarks.auto_vs_exhaustive                  # encoder, BERT, CNN, MLP on this CPU
    python -m benchmarks.auto_vs_exhaustive --models encoder --max-depth 2

For each model: ``tt.auto_tune`` with the default strategy (cold, timed), then every
(depth, single backend) combination tuned with ``OneBackendStrategy`` on its own copy of
the model. The untuned model, auto_tune's choice and every combination are then
measured end to end, interleaved, in one ``candidates.measure`` call, and the script prints
the ratio of auto_tune's selected latency to the best combination's.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import copy
import time
from typing import Any

import tunetree as tt
from tunetree.candidates.measure import cycle_calls, measure
from tunetree.signature.graph import as_samples

from . import common
from .common import models


def run(
    name: str, size: str, device: str, max_depth: int, config: tt.MeasureConfig
) -> dict[str, Any]:
    entry = models.build(name, size, device)
    samples = as_samples(entry.data)
    start = time.perf_counter()
    auto = tt.auto_tune(
        entry.model,
        entry.data,
        max_depth=max_depth,
        measure_config=config,
        verbose=False,
        cache=False,
    )
    tuning_s = time.perf_counter() - start
    print(auto)

    candidates: dict[str, Any] = {"untuned": common.caller(entry.model)}
    candidates["auto_tune"] = common.caller(auto.model)
    deepest = min(max_depth, auto.info.max_depth if auto.info else max_depth)
    for depth in range(deepest + 1):
        for backend in tt.default_strategy(device).backends:
            if backend.kind == "eager":
                continue
            own = copy.deepcopy(entry.model)
            result = tt.tune(
                own,
                entry.data,
                depth=depth,
                strategy=tt.OneBackendStrategy(backend),
                measure_config=tt.MeasureConfig.quick(),
                verbose=False,
                cache=False,  # cold tuning: build times are part of the result
            )
            failed = sum(1 for g in result.graphs if g.winner is None)
            label = f"d{depth}/{backend.name}" + (
                f" ({failed} graphs kept eager)" if failed else ""
            )
            candidates[label] = common.caller(result.model)
    timings = measure({k: cycle_calls(fn, samples) for k, fn in candidates.items()}, device, config)
    combos = {k: t for k, t in timings.items() if k not in ("untuned", "auto_tune")}
    best_name = min(combos, key=lambda k: combos[k].median_s)
    untuned = timings["untuned"].median_s
    best = min(combos[best_name].median_s, untuned)
    selected = timings["auto_tune"].median_s
    print(
        tt._table.format_table(
            ["configuration", "median", "vs untuned"],
            [
                [k, str(t), f"{untuned / t.median_s:.2f}x"]
                for k, t in sorted(timings.items(), key=lambda kv: kv[1].median_s)
            ],
        )
    )
    print(
        f"{name}: auto_tune chose depth {auto.depth}; selected {selected * 1e3:.3g} ms, best "
        f"single configuration {best_name} {combos[best_name].median_s * 1e3:.3g} ms; "
        f"selected / best = {selected / best:.3f}; cold tuning {tuning_s:.0f} s"
    )
    return {
        "model": name,
        "selected_depth": auto.depth,
        "depth_latency_ms": {r.depth: (r.latency_s or 0) * 1e3 for r in auto.rows},
        "timings_ms": {k: t.median_s * 1e3 for k, t in timings.items()},
        "best": best_name,
        "selected_over_best": selected / best,
        "tuning_s": tuning_s,
    }


def main() -> None:
    p = common.parser(__doc__ or "", ["encoder", "bert", "cnn", "mlp"])
    p.add_argument("--max-depth", type=int, default=2)
    args = p.parse_args()
    common.cuda_setup(args.device)
    info = common.header(common.command_line())
    config = tt.MeasureConfig.quick() if args.quick else tt.MeasureConfig()
    results = [
        run(n, common.size_for(args), args.device, args.max_depth, config)
        for n in args.models.split(",")
    ]
    print("\n## summary")
    print(
        tt._table.format_table(
            ["model", "selected depth", "selected / best", "best configuration", "cold tuning"],
            [
                [
                    r["model"],
                    r["selected_depth"],
                    f"{r['selected_over_best']:.3f}",
                    r["best"],
                    f"{r['tuning_s']:.0f} s",
                ]
                for r in results
            ],
        )
    )
    common.write_json(args.out, f"auto-{args.device}.json", {"run": info, "results": results})


if __name__ == "__main__":
    main()
