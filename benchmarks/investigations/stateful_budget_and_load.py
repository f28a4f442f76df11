"""Does generate's whole-model tune hold its time budget, and what does its save and load cost?

    python -m benchmarks.investigations.stateful_budget_and_load --model llama-134m --budget 300
    python -m benchmarks.investigations.stateful_budget_and_load --model tiny --budget 30

One random-weight model of ``benchmarks.generate_cpu`` (saved and loaded back with
``save_pretrained``), ``tt.auto_tune`` on its two tuning prompts with the usual ``generate``
call (dynamic cache, 32 new tokens) under ``--budget``, no tuning cache. Printed: the wall
time against the budget, what served generate, the whole-model trial's rows and the time by
phase; then ``tt.save`` (seconds, bytes, against the weights' own bytes) and ``tt.load`` onto
a fresh model (seconds: the export again and the check against eager), and whether the loaded
model generates eager's tokens on an unseen prompt. Load averages before and after: on a busy
machine the times are long, and this run is about the budget, not speed.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import tunetree as tt

from ..generate_cpu import TUNING, config, prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-134m")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds; 0: unlimited")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    import transformers

    print("load average before:", os.getloadavg(), flush=True)
    torch.manual_seed(0)
    cfg = config(args.model)
    directory = tempfile.mkdtemp(prefix="tunetree-stateful-")
    transformers.AutoModelForCausalLM.from_config(cfg).eval().save_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    n = args.tokens
    gen = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    tuning = [prompt(cfg.vocab_size, *shape, seed=100 + i) for i, shape in enumerate(TUNING)]

    def call(m: Any, **x: Any) -> Any:
        return m.generate(**x, **gen)

    start = time.perf_counter()
    result = tt.auto_tune(
        model, tuning, call=call, verbose=False, time_budget=args.budget or None, cache=False
    )
    wall = time.perf_counter() - start
    ratio = wall / args.budget if args.budget else 0.0
    print(f"auto_tune: {wall:.1f} s against a {args.budget:.0f} s budget ({ratio:.2f})")
    print(result, flush=True)
    out = Path(directory) / "model.tt"
    start = time.perf_counter()
    tt.save(result, out)
    save_s = time.perf_counter() - start
    weights = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    print(f"tt.save: {save_s:.1f} s, {out.stat().st_size / 2**20:.1f} MiB", end="")
    print(f" (the weights alone: {weights / 2**20:.1f} MiB)")
    fresh = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    start = time.perf_counter()
    loaded = tt.load(fresh, out)
    whole = any(t.chosen for t in result.stateful)
    what = "export again and check against eager" if whole else "untuned: weights only"
    print(f"tt.load: {time.perf_counter() - start:.1f} s ({what})")
    unseen = prompt(cfg.vocab_size, 3, 41, seed=7)
    same = torch.equal(loaded.generate(**unseen, **gen), model.generate(**unseen, **gen))
    print(f"loaded model on an unseen 3x41 prompt: tokens {'equal' if same else 'DIFFER'}")
    print("load average after:", os.getloadavg())


if __name__ == "__main__":
    main()
