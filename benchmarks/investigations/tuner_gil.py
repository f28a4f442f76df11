"""Does a background tuner's Python-heavy work stall the calls a serving thread makes?

``tt.jit`` tunes in a thread of the serving process. Run alone: ``python -m
benchmarks.investigations.tuner_gil --switch-ms 5,0.5``. A serving thread calls a 4-layer
h256 BERT (batch 4, 64 tokens) back to back for ``--seconds``, first alone, then while
another thread runs ``torch.export`` of a 12-layer BERT in a loop (the Python-heavy part of
a build); per interpreter switch interval: calls made, median, 99th percentile and worst call.
If the worst call shrinks with the switch interval, the serving thread waits on the GIL (the
interpreter hands it over only every interval), not only on the cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import torch


def _serve(model: torch.nn.Module, x: torch.Tensor, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        with torch.no_grad():
            model(x)
        out.append(time.perf_counter() - start)


def _export(model: torch.nn.Module, stop: threading.Event) -> None:
    while not stop.is_set():
        torch.export.export(model, (torch.randint(0, 1000, (1, 16)),))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--switch-ms", default="5,0.5", help="interpreter switch intervals")
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()
    import transformers

    print("load average before:", os.getloadavg(), flush=True)
    torch.manual_seed(0)
    small = transformers.BertConfig(
        num_hidden_layers=4, hidden_size=256, intermediate_size=1024, num_attention_heads=4
    )
    served = transformers.BertModel(small).eval()
    exported = transformers.BertModel(transformers.BertConfig(num_hidden_layers=12)).eval()
    x = torch.randint(0, 1000, (4, 64))
    before = sys.getswitchinterval()
    try:
        for ms in [float(v) for v in args.switch_ms.split(",")]:
            sys.setswitchinterval(ms / 1e3)
            for label, background in (("alone", False), ("beside torch.export", True)):
                stop, times = threading.Event(), []
                threads = [threading.Thread(target=_serve, args=(served, x, stop, times))]
                if background:
                    threads.append(threading.Thread(target=_export, args=(exported, stop)))
                for thread in threads:
                    thread.start()
                time.sleep(args.seconds)
                stop.set()
                for thread in threads:
                    thread.join()
                kept = sorted(times[3:])
                print(
                    f"switch interval {ms:g} ms, {label}: {len(kept)} calls, median "
                    f"{statistics.median(kept) * 1e3:.1f} ms, p99 "
                    f"{kept[int(len(kept) * 0.99)] * 1e3:.1f} ms, worst {kept[-1] * 1e3:.1f} ms",
                    flush=True,
                )
    finally:
        sys.setswitchinterval(before)
    print("load average after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
