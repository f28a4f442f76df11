"""Where does a ``generate`` step's time go outside the runtime, tunetree's against optimum-intel's?

Run alone, after ``python -m benchmarks.generate_cpu --work DIR`` (its ``DIR/model`` and
``DIR/usual.tt``): ``python -m benchmarks.investigations.step_overhead_cpu --work DIR``. Each
approach runs in its own process, alternately ``--rounds`` times: tunetree's ``.tt`` loaded here,
optimum-intel's ``OVModelForCausalLM(export=True)`` with the f32 hint in its own environment
(this file run there with ``--optimum``; built by :func:`benchmarks.generate_cpu.ensure_venv`).
Each process times greedy ``generate`` of 32 new tokens on a 1x37 prompt (two untimed calls
first, then ``--calls``), and per decode step: the runtime's own call (``infer``, or
``start_async`` to ``wait``), the model's ``forward`` less that call (the wrapper: binding inputs,
copying logits, building the output and cache objects), and ``generate``'s loop outside
``forward`` (logits processors, stopping criteria, the next step's inputs; a different
transformers version in optimum-intel's environment). Medians over the decode steps of all
timed calls; prints one line per process and each approach's median over its rounds.
"""

from __future__ import annotations

if not __package__:  # run by path: import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

NEW = 32


def _measure(model: Any, request_owner: Any, calls: int) -> dict[str, float]:
    """Per decode step: runtime call, wrapper and loop, in microseconds (medians)."""
    import torch

    runtime: list[float] = []
    forward_s: list[float] = []

    class Timed:
        """The infer request, its calls timed."""

        def __init__(self, request: Any) -> None:
            self.request, self.started = request, 0.0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.request, name)

        def infer(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = self.request.infer(*args, **kwargs)
            runtime.append(time.perf_counter() - start)
            return out

        def start_async(self, *args: Any, **kwargs: Any) -> Any:
            self.started = time.perf_counter()
            return self.request.start_async(*args, **kwargs)

        def wait(self, *args: Any, **kwargs: Any) -> Any:
            out = self.request.wait(*args, **kwargs)
            runtime.append(time.perf_counter() - self.started)
            return out

    request_owner.request = Timed(request_owner.request)
    forward = type(model).forward if "forward" not in vars(model) else model.forward
    if "forward" in vars(model):  # tunetree's callable instance on the model
        kind = type(forward)
        original_call = kind.__call__

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = original_call(self, *args, **kwargs)
            forward_s.append(time.perf_counter() - start)
            return out

        kind.__call__ = call
    else:

        @functools.wraps(forward)
        def timed_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = forward(self, *args, **kwargs)
            forward_s.append(time.perf_counter() - start)
            return out

        type(model).forward = timed_forward
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, 37), generator=generator)
    gen = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    for _ in range(2):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)
    runtime.clear()
    forward_s.clear()
    whole: list[float] = []
    for _ in range(calls):
        start = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)
        whole.append(time.perf_counter() - start)
    steps = [i for i in range(len(runtime)) if i % NEW]  # the prefill of each call left out
    wrapper = [forward_s[i] - runtime[i] for i in steps]
    loop = statistics.median(whole) - sum(forward_s) / calls
    return {
        "runtime_us": 1e6 * statistics.median(runtime[i] for i in steps),
        "wrapper_us": 1e6 * statistics.median(wrapper),
        "loop_us": 1e6 * loop / NEW,
        "generate_ms": 1e3 * statistics.median(whole),
    }


def _tunetree(work: Path, calls: int) -> dict[str, float]:
    import transformers

    import tunetree as tt

    model = transformers.AutoModelForCausalLM.from_pretrained(str(work / "model")).eval()
    model = tt.load(model, str(work / "usual.tt"))
    return _measure(model, model.forward.runner, calls)


def _optimum(work: Path, calls: int) -> dict[str, float]:
    from optimum.intel import OVModelForCausalLM

    model = OVModelForCausalLM.from_pretrained(
        str(work / "model"), export=True, ov_config={"INFERENCE_PRECISION_HINT": "f32"}
    )
    return _measure(model, model, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--optimum", action="store_true", help="(a worker) optimum-intel's side")
    parser.add_argument("--tunetree", action="store_true", help="(a worker) tunetree's side")
    args = parser.parse_args()
    if args.optimum or args.tunetree:
        measured = (_optimum if args.optimum else _tunetree)(args.work, args.calls)
        print(json.dumps(measured), flush=True)
        return
    import os

    from benchmarks.generate_cpu import OPTIMUM_VENV, ensure_venv

    print("load average before:", os.getloadavg(), flush=True)
    here = [sys.executable, "-m", "benchmarks.investigations.step_overhead_cpu"]
    there = [str(ensure_venv(OPTIMUM_VENV)), str(Path(__file__).resolve())]
    sides = {"tunetree usual call": (here, "--tunetree"), "optimum-intel f32": (there, "--optimum")}
    found: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            command, flag = sides[name]
            out = subprocess.run(
                [*command, flag, "--work", str(args.work), "--calls", str(args.calls)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            measured = json.loads(next(x for x in out.splitlines()[::-1] if x.startswith("{")))
            found[name].append(measured)
            cells = ", ".join(f"{k} {v:.1f}" for k, v in measured.items())
            print(f"round {r + 1} {name}: {cells}", flush=True)
    print("medians over the rounds (per decode step, us; whole generate, ms):")
    for name, rounds in found.items():
        keys = rounds[0].keys()
        cells = ", ".join(f"{k} {statistics.median(x[k] for x in rounds):.1f}" for k in keys)
        print(f"  {name}: {cells}")
    print("load average after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
