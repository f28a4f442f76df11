"""Why the user's other work is slower right after a tuned CPU call (issue 30), on the CPU.

Run: ``python -m benchmarks.investigations.other_work_gap`` (alone on the machine).

The serving benchmark times the other work (an eager MLP, about 5 ms) right after a tuned
BERT-2L call against the other work right after itself. This script adds what separates the
causes: right after an eager call of the same model, right after 10 ms of sleep (no call at
all), and right after the ONNX Runtime or OpenVINO call followed by a 2 ms sleep or by a tiny
torch matmul (which wakes torch's own thread pool before the other work). Rounds are a Williams
design (:func:`benchmarks.common.interleave.rotations`); per round and case, the median of six;
then the
median of the rounds, over ``alone``.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import common, serving
from ..common.interleave import rotations


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args()
    print(common.header(common.command_line()))
    device = torch.device("cpu")
    work = serving.MODELS["bert"](device, False)
    recorded = serving.subset(serving.trace(work, 40), 6)
    built = serving.Built(work, recorded, recorded)
    ort = serving.forced(built, "onnxruntime", device)
    ov = serving.forced(built, "openvino", device)
    torch.manual_seed(1)
    other_model = serving.OtherWork(256).eval()
    x = torch.randn(16, 64, 256)
    tiny = torch.randn(64, 64)

    def other() -> Any:
        return other_model(x)

    cases: dict[str, Callable[[Any], Any]] = {
        "alone (other work after other work)": lambda s: other(),
        "after the untuned model's call": lambda s: s.run(work.model),
        "after onnxruntime": lambda s: s.run(ort),
        "after onnxruntime, then 2 ms of sleep": lambda s: (s.run(ort), time.sleep(0.002)),
        "after onnxruntime, then a tiny torch matmul": lambda s: (s.run(ort), tiny @ tiny),
        "after openvino": lambda s: s.run(ov),
        "after 10 ms of sleep (no call)": lambda s: time.sleep(0.010),
    }
    medians: dict[str, list[float]] = {name: [] for name in cases}
    with torch.no_grad():
        for order in rotations(list(cases), args.rounds):
            for name in order:
                got = []
                for sample in recorded:
                    cases[name](sample)
                    start = time.perf_counter()
                    other()
                    got.append(time.perf_counter() - start)
                medians[name].append(statistics.median(got))
    base = statistics.median(medians["alone (other work after other work)"])
    print("| the other work ... | ms | over alone |\n|---|---|---|")
    for name, values in medians.items():
        ms = statistics.median(values)
        print(f"| {name} | {ms * 1e3:.3f} | {ms / base:.3f} |")
    print(f"# {serving.load()}")


if __name__ == "__main__":
    main()
