"""Does loading a tuned plan from the cache stall a serving thread of the same process?

After a cold tune in a child process, ``tt.jit`` loads the plan from the tuning cache in the
serving process (as a second process would: nothing is built) and checks it there. Run alone:
``python -m benchmarks.investigations.warm_load_stall --cache DIR`` where DIR holds the plan
``benchmarks/jit.py --model base --calls 16`` tuned on the first 8 calls of its trace (that
run's ``tt-jit-bench-*`` directory). A serving thread calls BERT-base (batch 4, 64 tokens)
back to back, first alone, then while the main thread runs ``tt.auto_tune`` on those 8 calls
with that cache; the auto_tune's phases and builds are printed, and the worst calls with the
phase they fell in (from the ``tunetree`` log records' times).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any

import torch


def _serve(model: Any, x: dict, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        with torch.no_grad():
            model(**x)
        out.append((start, time.perf_counter() - start))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", required=True)
    parser.add_argument("--seconds", type=float, default=20.0, help="serving alone first")
    args = parser.parse_args()
    import tunetree as tt
    from benchmarks.jit import build, log_stamps, trace

    print("load average before:", os.getloadavg(), flush=True)
    model = build("base")
    samples = trace(16)[:8]
    x = {"input_ids": torch.randint(0, 30000, (4, 64))}
    x["attention_mask"] = torch.ones_like(x["input_ids"])
    stamps = log_stamps()
    for label, loading in (("alone", False), ("beside the warm auto_tune", True)):
        stop, times = threading.Event(), []
        thread = threading.Thread(target=_serve, args=(model, x, stop, times))
        thread.start()
        began = time.perf_counter()
        result = None
        if loading:
            result = tt.auto_tune(build("base"), samples, cache=args.cache, verbose=False)
        else:
            time.sleep(args.seconds)
        took = time.perf_counter() - began
        stop.set()
        thread.join()
        kept = sorted(t for _, t in times[2:])
        print(
            f"{label}: {took:.1f} s, {len(kept)} calls, median "
            f"{statistics.median(kept) * 1e3:.1f} ms, worst {kept[-1] * 1e3:.1f} ms",
            flush=True,
        )
        if result is not None:
            print(result, flush=True)
            worst = sorted(times[2:], key=lambda st: -st[1])[:6]
            for start, t in worst:
                last = stamps.last_before(start + t, began)
                print(f"  call of {t * 1e3:.0f} ms at +{start - began:.1f} s, after: {last}")
    print("load average after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
