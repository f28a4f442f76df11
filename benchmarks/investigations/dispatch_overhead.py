"""What the dispatcher costs per call: routing a call to its runner, ranged graphs included.

Run: ``python -m benchmarks.investigations.dispatch_overhead`` (``--quick``: a small MLP whose root
is
wrapped with an eager runner, seconds; otherwise the 4x1024 MLP at batch 32 tuned with the
default strategy on batch sizes 1..32, so the call at batch 32 is served by a ranged graph).
Measured side by side in one ``candidates.measure`` run:

- ``runner``: the winning runner called directly, and ``tuned``: the tuned model;
- ``null``: a runner that returns at once, and ``dispatch(null)``: the same runner behind a
  dispatcher for the same ranged graph. Their difference is the dispatcher's own cost per
  call (binding the arguments, keying the call, one dict lookup), free of the runner's noise.

Prints the overhead as a share of the tuned model's latency (goal: under 5 % on CPU).
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

from typing import Any

import torch
from torch import nn

import tunetree as tt
from tunetree.backends import Eager
from tunetree.backends.base import Runner
from tunetree.candidates.measure import measure
from tunetree.runtime.wrap import Dispatcher, dispatcher_of, wrap

from ..common import command_line, header, parser, write_json


class _Null(Runner):
    """Returns its input: what is left of a call once the runner costs nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0]


def _mlp(width: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers).eval()


def _tuned(model: nn.Module, data: list[Any], quick: bool) -> Any:
    """The model with its root wrapped: tuned with the default strategy, or (quick) an
    eager runner installed for the inspected ranged graph."""
    if not quick:
        return tt.tune(model, data, depth=0, verbose=False, cache=False).model
    info = tt.inspect(model, data)
    (graph,) = info.modules[""].graphs.values()
    runner = Eager().build(model, graph, torch.device("cpu"))
    return wrap(model, {"": {graph.key: runner}})


def main() -> None:
    args = parser(__doc__.splitlines()[0], ["mlp"]).parse_args()
    info = header(command_line())
    width, batch = (64, 8) if args.quick else (1024, 32)
    x = torch.randn(batch, width)
    data = tt.rebatch([x], sorted({1, batch // 2, batch}))
    model = _mlp(width)
    tuned = _tuned(model, data, args.quick)
    dispatcher = dispatcher_of(tuned)
    if dispatcher is None:
        print("every graph kept eager: nothing is dispatched (overhead 0)")
        return
    key = next(iter(dispatcher.runners))
    runner = dispatcher.runners[key]
    null = _Null(Eager())
    routed = Dispatcher(model, "", {key: null})
    print(f"graph {key}, served by {runner.backend.name}")
    config = tt.MeasureConfig.quick() if args.quick else tt.MeasureConfig()
    timings = measure(
        {
            "runner": lambda: runner(x),
            "tuned": lambda: tuned(x),
            "null": lambda: null(x),
            "dispatch(null)": lambda: routed(x),
        },
        "cpu",
        config,
    )
    for name, timing in timings.items():
        print(f"{name:>15}: {timing}")
    overhead = timings["dispatch(null)"].median_s - timings["null"].median_s
    share = overhead / timings["tuned"].median_s
    verdict = "ok" if share < 0.05 else "over the 5% goal"
    print(
        f"dispatcher overhead: {overhead * 1e6:.2f} µs per call = {100 * share:.2f}% of the "
        f"tuned latency ({verdict})"
    )
    write_json(
        args.out,
        "dispatch_overhead.json",
        {
            "header": info,
            "graph": str(key),
            "timings_s": {k: t.median_s for k, t in timings.items()},
            "overhead_s": overhead,
            "share": share,
        },
    )


if __name__ == "__main__":
    main()
