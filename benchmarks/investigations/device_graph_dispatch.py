"""The Python a device-graph call pays around its replay, measured on the CPU (issue 30).

Run: ``python -m benchmarks.investigations.device_graph_dispatch`` (alone on the machine).

On a GPU a small model served by a device graph costs its replay plus the host's work around
it; the work is what tunetree adds to copying the inputs in and cloning the outputs by hand.
This script measures that work without a GPU: the device-graph backend's capture API is
swapped for the tests' CPU stand-in (``tests/replay_graphs.py``: a replay runs the captured aten
ops again), so tuning checks real outputs; then, for the timing, replay does nothing, so what is
timed is the dispatcher, the runner's routing and its copies. Per call, side by side in one run,
interleaved rounds, medians:

- ``by hand``: copy the input into a static buffer, clone the static output;
- ``tunetree, exact``: the tuned model, tuned on one batch size (one capture);
- ``tunetree, ranged``: tuned on three batch sizes, called at one of them (a capture per shape).
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tests import replay_graphs


def _tuned(model: nn.Module, batches: tuple[int, ...], width: int) -> Any:
    data = [torch.randn(b, width) for b in batches]
    result = tt.tune(
        model,
        data,
        strategy=tt.OneBackendStrategy(tt.backends.DeviceGraph()),
        measure_config=tt.MeasureConfig.quick(),
        cache=False,
        verbose=False,
    )
    return result.model


def _per_call_us(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, torch {torch.__version__}, CPU threads "
          f"{torch.get_num_threads()}")  # fmt: skip
    stand_in = replay_graphs.op_graphs.__wrapped__(pytest.MonkeyPatch())  # type: ignore[attr-defined]
    next(stand_in)
    torch.manual_seed(0)
    width, batch = args.width, args.batch
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(4)]).eval()
    exact = _tuned(model, (batch,), width)
    ranged = _tuned(model, (batch // 2, batch, batch * 2), width)
    replay_graphs.OpGraph.replay = lambda self: None  # type: ignore[method-assign]
    static_in, static_out = torch.randn(batch, width), torch.randn(batch, width)

    def by_hand(x: torch.Tensor) -> torch.Tensor:
        static_in.copy_(x)
        return static_out.clone()

    approaches = {"by hand": by_hand, "tunetree, exact": exact, "tunetree, ranged": ranged}
    x = torch.randn(batch, width)
    times: dict[str, list[float]] = {name: [] for name in approaches}
    with torch.inference_mode():
        for fn in approaches.values():
            _per_call_us(fn, x, 1000)  # warm-up
        for _ in range(args.rounds):
            for name, fn in approaches.items():
                times[name].append(_per_call_us(fn, x, args.calls))
    hand = statistics.median(times["by hand"])
    print(f"MLP 4x{width}, batch {batch}, {args.rounds} rounds of {args.calls} calls, medians")
    for name, values in times.items():
        median = statistics.median(values)
        spread = (max(values) - min(values)) / 2
        print(f"{name:18s} {median:7.2f} us per call (±{spread:.2f}), "
              f"+{median - hand:.2f} us over by hand")  # fmt: skip


if __name__ == "__main__":
    main()
