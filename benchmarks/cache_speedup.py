"""How much the tuning cache saves: the same ``tt.tune`` twice, each in a fresh process.

Run: ``python benchmarks/cache_speedup.py`` (add ``--quick`` for a tiny MLP). The first run
tunes the model with the default strategy into an empty cache (and an empty Inductor cache,
so it pays every compile); then ``--repeat`` new processes on the same machine find every
graph in the cache. Prints, per run, the wall time of ``tt.tune`` (imports excluded), the
number of backend builds, cache hits and misses, the winners, whether the tuned outputs
match eager, and the load average; then the re-runs' median time as a share of the first
run's (goal: under 10 %, zero builds). On a shared 2-core machine a busy neighbour slows a
fresh process's first eager calls (inspection) several times over: note the load.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import argparse
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


def _model(name: str) -> tuple[Any, list[Any]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model: nn.Module
    if name == "mlp":
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
        return model.eval(), [torch.randn(16, 256) for _ in range(2)]
    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
    model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    return model.eval(), [torch.randn(8, 128, 256) for _ in range(2)]


def child(args: argparse.Namespace) -> None:
    """One tune in this (fresh) process; prints one JSON line."""
    import torch

    import tunetree as tt
    from tunetree.backends.registry import BUILTIN_BACKENDS

    builds: list[str] = []
    for cls in BUILTIN_BACKENDS:  # count every backend build, whichever backend it is
        original = cls.build

        def counting(self: Any, *a: Any, _original: Any = original, **k: Any) -> Any:
            builds.append(self.kind)
            return _original(self, *a, **k)

        cls.build = counting  # type: ignore[method-assign]

    model, data = _model(args.model)
    cache = tt.TuningCache(args.cache_dir)
    config = tt.MeasureConfig.quick() if args.model == "mlp" else tt.MeasureConfig()
    start = time.perf_counter()
    result = tt.tune(model, data, depth=args.depth, cache=cache, measure_config=config)
    wall = time.perf_counter() - start
    with torch.no_grad():
        ok = all(torch.allclose(result.model(x), model(x), atol=1e-4, rtol=1e-3) for x in data)
    winners = sorted({g.winner.backend.name for g in result.graphs if g.winner is not None})
    print(
        json.dumps(
            {
                "wall_s": wall,
                "builds": len(builds),
                "built": builds,
                "hits": cache.stats.hits,
                "misses": cache.stats.misses,
                "winners": winners,
                "graphs": len(result.graphs),
                "outputs_match_eager": ok,
                "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
            }
        ),
        flush=True,
    )


def run_child(args: argparse.Namespace, cache_dir: str, env: dict[str, str]) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--child",
        "--model",
        args.model,
        "--depth",
        str(args.depth),
        "--cache-dir",
        cache_dir,
    ]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"the tuning process failed with exit status {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["encoder", "mlp"], default="encoder")
    parser.add_argument("--quick", action="store_true", help="the small MLP instead")
    parser.add_argument("--depth", type=int, default=0)
    parser.add_argument(
        "--repeat", type=int, default=3, help="fresh-process re-runs (their median is compared)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.model = "mlp"
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="tunetree-bench-") as tmp:
        env = dict(os.environ)
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")  # a true first run
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        cache_dir = os.path.join(tmp, "tunetree")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(
            f"cache speed-up: {args.model}, depth {args.depth}, default strategy, "
            f"{os.cpu_count()} CPUs, load average {load:.2f}"
        )
        first = run_child(args, cache_dir, env)
        seconds = [run_child(args, cache_dir, env) for _ in range(args.repeat)]
        runs = [("first (empty cache)", first)] + [
            (f"again #{i + 1} (fresh process)", run) for i, run in enumerate(seconds)
        ]
        for name, run in runs:
            print(
                f"{name:28s} tune {run['wall_s']:8.2f} s  builds {run['builds']:2d} "
                f"{run['built']}  hits {run['hits']}  misses {run['misses']}  "
                f"winners {run['winners']}  outputs match eager: {run['outputs_match_eager']}  "
                f"(load {run['load']:.2f})"
            )
        again = statistics.median(run["wall_s"] for run in seconds)
        builds = max(run["builds"] for run in seconds)
        share = again / first["wall_s"]
        verdict = "ok" if share < 0.10 and builds == 0 else "MISSED"
        print(
            f"median of the fresh-process re-runs / first = {again:.2f} s / "
            f"{first['wall_s']:.2f} s = {100 * share:.1f} % of the wall time, at most {builds} "
            f"builds in a re-run (goal: < 10 %, 0 builds): {verdict}"
        )


if __name__ == "__main__":
    main()
