"""Every default candidate at depth 0, side by side in one run, against eager.

    python -m benchmarks.backends --device cpu              # MLP, encoder, CNN, BERT
    python -m benchmarks.backends --device cuda --models mlp,encoder,bert,mlp-large

For each model, ``tt.tune(depth=0, strategy=tt.default_strategy(device))`` builds every
candidate, checks it against eager and measures all of them interleaved (one
``candidates.measure`` call): the rows are the comparison.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

from typing import Any

import torch

import tunetree as tt

from . import common
from .common import models


def opt_in_backends(device: str) -> list[tt.backends.Backend]:
    """Candidates that change results (bf16, int8), available here: measured only on request."""
    candidates: list[tt.backends.Backend] = [
        tt.backends.OpenVINOBf16(),
        tt.backends.Autocast(dtype="bf16"),
        tt.backends.TorchAO(scheme="int8-dynamic"),
    ]
    dev = torch.device(device)
    return [b for b in candidates if b.unavailable_reason(dev) is None]


def run_model(
    name: str, size: str, device: str, config: tt.MeasureConfig, opt_in: bool = False
) -> dict[str, Any]:
    entry = models.build(name, size, device)
    strategy = tt.default_strategy(device)
    if opt_in:  # labelled "changes results, opt-in" in every row
        strategy = tt.HighestThroughputStrategy(strategy.backends + opt_in_backends(device))
    result = tt.tune(
        entry.model,
        entry.data,
        depth=0,
        strategy=strategy,
        measure_config=config,
        verbose=False,
        cache=False,
    )
    graph = result.graphs[0]
    eager = graph.eager_latency_s
    rows = []
    for row in graph.rows:
        rows.append(
            {
                "backend": row.backend.name,
                "status": row.describe(),
                "median_ms": row.latency_s * 1e3 if row.latency_s else None,
                "spread_pct": 100 * row.timing.spread if row.timing else None,
                "vs_eager": eager / row.latency_s if eager and row.latency_s else None,
                "build_s": row.build_s,
                "max_abs_diff": row.max_abs_diff,
                "winner": row is graph.winner,
            }
        )
    winner = graph.winner
    fastest = min((r.latency_s for r in graph.rows if r.latency_s), default=None)
    return {
        "model": name,
        "eager_ms": eager * 1e3 if eager else None,
        "winner": winner.backend.name if winner else None,
        "winner_vs_eager": eager / winner.latency_s
        if winner and eager and winner.latency_s
        else None,
        "winner_vs_fastest": winner.latency_s / fastest
        if winner and fastest and winner.latency_s
        else None,
        "rows": rows,
    }


def main() -> None:
    p = common.parser(__doc__ or "", models.DESIGN_FOUR)
    p.add_argument(
        "--opt-in",
        action="store_true",
        help="also measure candidates that change results (bf16, int8), labelled as such",
    )
    args = p.parse_args()
    common.cuda_setup(args.device)
    info = common.header(common.command_line())
    config = tt.MeasureConfig.quick() if args.quick else tt.MeasureConfig()
    results = []
    for name in args.models.split(","):
        try:
            r = run_model(name, common.size_for(args), args.device, config, args.opt_in)
        except Exception as exc:  # one broken model must not lose the others' numbers
            print(f"\n## {name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            continue
        results.append(r)
        print(
            f"\n## {name}: eager {r['eager_ms']:.3g} ms, winner {r['winner']} "
            f"({r['winner_vs_eager']:.2f}x eager)"
        )
        print(
            tt._table.format_table(
                ["backend", "status", "median", "spread", "vs eager", "build", "max diff"],
                [
                    [
                        ("*" if x["winner"] else "") + x["backend"],
                        x["status"][:70],
                        f"{x['median_ms']:.3g} ms" if x["median_ms"] else "-",
                        f"±{x['spread_pct'] / 2:.1f}%" if x["spread_pct"] is not None else "-",
                        f"{x['vs_eager']:.2f}x" if x["vs_eager"] else "-",
                        f"{x['build_s']:.1f} s" if x["build_s"] else "-",
                        f"{x['max_abs_diff']:.1g}" if x["max_abs_diff"] is not None else "-",
                    ]
                    for x in r["rows"]
                ],
            )
        )
    print("\n## summary")
    print(
        tt._table.format_table(
            ["model", "eager", "winner", "winner vs eager", "winner / fastest candidate"],
            [
                [
                    r["model"],
                    f"{r['eager_ms']:.3g} ms",
                    r["winner"],
                    f"{r['winner_vs_eager']:.2f}x",
                    f"{r['winner_vs_fastest']:.3f}",
                ]
                for r in results
            ],
        )
    )
    suffix = "-opt-in" if args.opt_in else ""
    common.write_json(
        args.out, f"backends-{args.device}{suffix}.json", {"run": info, "results": results}
    )


if __name__ == "__main__":
    main()
