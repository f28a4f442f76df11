"""Is tunetree's CUDA graph capture itself slower to replay than one made by hand? (issue 30)

Run: ``python -m benchmarks.investigations.device_graph_replay`` (CUDA only; about a minute).

``runner_overhead --device cuda`` times tunetree's device-graph runner beside CUDA graphs by hand
with every call timed; the gap it finds could be the capture (tunetree shares one memory pool
between a runner's captures and captures with cuBLAS workspaces of its own) or the Python path
in front of the replay. This script separates the two: on the MLP 4x1024 (batch 32) and BERT-2L
(16 x 64), it captures six shapes five ways (by hand; by hand with a shared pool; by hand with the
workspaces dropped around the capture; both; tunetree's ``ShapeSetRunner``) and times the same
pre-bound call on each (copy the inputs in, replay, clone the outputs: no dispatch at all) by CUDA
events over 300 calls, 15 rounds (``--rounds``) in alternating orders, medians. Every capture's
outputs are compared with the first by-hand capture's, bit for bit.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import statistics
from collections.abc import Callable

import torch
from torch import nn

from tunetree.backends.device_graph import DeviceGraph, ShapeSetRunner
from tunetree.signature.graph import GraphKey, Sample

from ..common import command_line, header
from ..runner_overhead import CudaGraphsByHand, bert2, device_graph_call, mlp, replay_call


def by_hand(
    model: nn.Module, samples: list[Sample], target: int, pool: bool = False, drop: bool = False
) -> Callable:
    """The pre-bound call on the by-hand capture of ``samples[target]``: captures sharing one
    pool (``pool``), cuBLAS's workspaces dropped around each capture (``drop``)."""
    shared = torch.cuda.graph_pool_handle() if pool else None
    hand = CudaGraphsByHand(model, samples, pool=shared, drop_workspaces=drop)
    want = samples[target]
    values = [*want.args, *want.kwargs.values()]
    graph, static, outs = hand.graphs[tuple(t.shape for t in values)]
    return replay_call(graph, list(zip(static, values, strict=True)), outs)


def tunetree_capture(model: nn.Module, samples: list[Sample], target: int) -> Callable:
    first = samples[0]
    runner = ShapeSetRunner(
        DeviceGraph(), model, GraphKey.of(first.args, first.kwargs), torch.device("cuda"), samples
    )
    return device_graph_call(runner, samples[target])


def gpu_us(call: Callable, n: int = 300) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15, help="timed rounds per capture")
    args = p.parse_args()
    print(" | ".join(f"{k}: {v}" for k, v in header(command_line()).items()), flush=True)
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to measure")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    workloads = [
        (mlp, [(1, 0), (4, 0), (8, 0), (16, 0), (24, 0), (32, 0)], 5),
        (bert2, [(1, 16), (4, 32), (8, 64), (16, 128), (2, 96), (16, 64)], 5),
    ]
    for make_work, shapes, target in workloads:
        work = make_work(device, False)
        samples = [work.make(b, s) for b, s in shapes]
        calls = {
            "by hand": by_hand(work.model, samples, target),
            "by hand, shared pool": by_hand(work.model, samples, target, pool=True),
            "by hand, workspaces dropped": by_hand(work.model, samples, target, drop=True),
            "by hand, both": by_hand(work.model, samples, target, pool=True, drop=True),
            "tunetree's capture": tunetree_capture(work.model, samples, target),
        }
        reference = calls["by hand"]()
        for name, call in calls.items():
            got = call()
            same = all(
                torch.equal(a, b)
                for a, b in zip(
                    got if isinstance(got, tuple) else (got,),
                    reference if isinstance(reference, tuple) else (reference,),
                    strict=True,
                )
            )
            print(f"{work.name} {name}: outputs equal the capture by hand: {same}")
        times: dict[str, list[float]] = {name: [] for name in calls}
        for round_ in range(args.rounds):
            for name in list(calls) if round_ % 2 == 0 else list(reversed(calls)):
                times[name].append(gpu_us(calls[name]))
        base = statistics.median(times["by hand"])
        for name, values in times.items():
            median = statistics.median(values)
            print(f"{work.name} {shapes[target]}: {name:28s} {median:8.2f} us per call "
                  f"(min {min(values):.2f}, max {max(values):.2f}; {median / base:.3f}x by hand)",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
