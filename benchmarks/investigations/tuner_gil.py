"""Does a background tuner's Python-heavy work stall the calls a serving thread makes?

``tt.jit`` tunes in a thread of the serving process. Run alone: ``python -m
benchmarks.investigations.tuner_gil --switch-ms 5,0.5``. A serving thread calls a 4-layer
h256 BERT (batch 4, 64 tokens) back to back for ``--seconds``, first alone, then while
another thread runs ``torch.export`` of a 12-layer BERT in a loop (the Python-heavy part of
a build); per interpreter switch interval: calls made, median, 99th percentile and worst call.
If the worst call shrinks with the switch interval, the serving thread waits on the GIL (the
interpreter hands it over only every interval), not only on the cores.

``--process`` runs the same background work in a child process instead (its own GIL), at
each nice value of ``--nice``: what is left is the cores. ``--work compute`` makes the
background a 12-layer BERT's forward in a loop at torch's thread count (what a tune's
measurements do) instead of ``torch.export``.
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


def _compute(model: torch.nn.Module, stop: threading.Event) -> None:
    x = torch.randint(0, 1000, (4, 64))
    while not stop.is_set():
        with torch.no_grad():
            model(x)


def _background_child(work: str, nice: int) -> None:
    """The child process of ``--process``: lower its priority, then loop until killed."""
    import transformers

    os.setpriority(os.PRIO_PROCESS, 0, nice)
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(num_hidden_layers=12)).eval()
    (_compute if work == "compute" else _export)(model, threading.Event())


def _child_rows(served: torch.nn.Module, x: torch.Tensor, args: argparse.Namespace) -> None:
    import subprocess

    for nice in [int(v) for v in args.nice.split(",")]:
        beside = f"beside a child ({args.work}, nice {nice})"
        for label, background in (("alone", False), (beside, True)):
            child = None
            if background:
                child = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.investigations.tuner_gil",
                        "--child",
                        "--work",
                        args.work,
                        "--nice",
                        str(nice),
                    ]
                )
                time.sleep(8.0)  # its imports and model build
            stop, times = threading.Event(), []
            thread = threading.Thread(target=_serve, args=(served, x, stop, times))
            thread.start()
            time.sleep(args.seconds)
            stop.set()
            thread.join()
            if child is not None:
                child.kill()
                child.wait()
            _report(label, times)


def _report(label: str, times: list[float]) -> None:
    kept = sorted(times[3:])
    print(
        f"{label}: {len(kept)} calls, median {statistics.median(kept) * 1e3:.1f} ms, p99 "
        f"{kept[int(len(kept) * 0.99)] * 1e3:.1f} ms, worst {kept[-1] * 1e3:.1f} ms",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--switch-ms", default="5,0.5", help="interpreter switch intervals")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--process", action="store_true", help="background in a child process")
    parser.add_argument("--work", choices=("export", "compute"), default="export")
    parser.add_argument("--nice", default="0,10", help="the child's nice values (--process)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _background_child(args.work, int(args.nice))
        return
    import transformers

    print("load average before:", os.getloadavg(), flush=True)
    torch.manual_seed(0)
    small = transformers.BertConfig(
        num_hidden_layers=4, hidden_size=256, intermediate_size=1024, num_attention_heads=4
    )
    served = transformers.BertModel(small).eval()
    exported = transformers.BertModel(transformers.BertConfig(num_hidden_layers=12)).eval()
    x = torch.randint(0, 1000, (4, 64))
    if args.process:
        _child_rows(served, x, args)
        print("load average after:", os.getloadavg(), flush=True)
        return
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
