"""What is the floor of a warm start's load of a recorded plan, each piece timed alone?

A warm ``tt.jit`` process loads the plan an earlier process recorded and checks it against
eager before it serves: eager's outputs of the recorded calls (the inspection), the runner on
those calls, the graph's probes (eager and the runner), the runner's load (an ONNX Runtime
session) and the imports that takes. Run alone, after
``python benchmarks/jit.py --model base --calls 16 --no-compare --backends onnxruntime
--max-depth 1 --cache DIR`` (its cache keeps the calls and the plan):
``python -m benchmarks.investigations.warm_floor --cache DIR --backends onnxruntime
--max-depth 1``. Prints each piece, then ``load_recorded`` as a whole with its phases: the sum
of the pieces is the floor a load that keeps every check can reach on this machine.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _graph_rows(result: Any, depth: int) -> list[tuple[str, float]]:
    """Each graph's probes (eager, then the runner) and its ONNX Runtime session, timed."""
    import onnxruntime

    from tunetree.signature.probes import checks

    rows = []
    for graph in result.graphs[depth]:
        runner, module = graph.winner.runner, result.original
        if graph.path:
            module = module.get_submodule(graph.path)
        graph.graph.checks = None  # built again: eager's outputs on the probes
        took, probes = _timed(lambda g=graph.graph, m=module: list(checks(m, g)))
        rows.append((f"{len(probes)} probes of {graph.path or '<model>'}, eager", took))

        def probe_runs(r: Any = runner, ps: list = probes) -> None:
            with torch.no_grad():
                for p in ps:
                    p.run(r)

        rows.append((f"{len(probes)} probes, the runner", _timed(probe_runs)[0]))
        directory = getattr(runner, "directory", None)
        if directory is not None:

            def session(b: Any = runner.backend, d: Path = directory) -> Any:
                return onnxruntime.InferenceSession(
                    str(d / "model.onnx"), sess_options=b.session_options()
                )

            rows.append(("ONNX Runtime session (first)", _timed(session)[0]))
            rows.append(("ONNX Runtime session (again)", _timed(session)[0]))
    return rows


def _passes(samples: list, fn: Any) -> float:
    """Seconds of one pass of ``fn`` over ``samples``."""
    start = time.perf_counter()
    with torch.no_grad():
        for s in samples:
            s.run(fn)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", required=True)
    parser.add_argument("--model", default="base", choices=["base", "small"])
    parser.add_argument("--backends", default="onnxruntime")
    parser.add_argument("--max-depth", default="1")
    parser.add_argument("--time-budget", default="300")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}; torch threads {torch.get_num_threads()}")
    rows = [("import onnx (ml_dtypes: holds the GIL)", _timed(lambda: __import__("onnx"))[0])]
    from benchmarks.jit import build, options, parse
    from tunetree.live.store import CallsStore, calls_key
    from tunetree.search.recorded import load_recorded

    given = ["--model", args.model, "--backends", args.backends, "--max-depth", args.max_depth]
    jit_args = parse([*given, "--time-budget", args.time_budget])
    model = build(args.model)
    device = torch.device("cpu")
    store = CallsStore(Path(args.cache), None, 1 << 30)
    found = store.get(calls_key(model, None, device), device)
    if found is None or found[3] is None:
        raise SystemExit(f"no recorded calls with a plan in {args.cache}")
    samples, _, _, plan = found
    print(f"{len(samples)} recorded calls; plan of depth {plan.depth}: {plan.graphs}")
    rows.append(("eager, recorded calls (first pass)", _passes(samples, model)))
    rows.append(("eager, recorded calls (second pass)", _passes(samples, model)))
    took, result = _timed(
        lambda: load_recorded(
            build(args.model), samples, plan, cache=args.cache, options=options(jit_args)
        )
    )
    if result is None:
        raise SystemExit("the recorded plan was not served (see the log)")
    phases = ", ".join(f"{p.label} {p.seconds:.2f} s" for p in result.breakdown.phases)
    rows.append(("tuned model, recorded calls", _passes(samples, result.model)))
    rows += _graph_rows(result, plan.depth)
    for label, seconds in rows:
        print(f"{label:45s} {seconds:7.2f} s")
    print(f"{'load_recorded as a whole':45s} {took:7.2f} s ({phases})")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
