"""What keeping eager's zeros on fully masked attention rows costs an exported graph (issue 30).

Run: ``python -m benchmarks.investigations.attention_guard [--rounds N]`` (alone on the machine).

Eager's attention gives zeros for a query row that a boolean mask hides entirely; an exported
softmax gives the mean of the values there, so tunetree exports attention with a guard
(:func:`tunetree.backends.export_context.attention_as_eager`). This script exports BERT-2L with
a padded mask by hand (the dynamo ONNX exporter, as ``benchmarks.runner_overhead`` does) with
and without the guard, prints the nodes each graph holds, and times the two ONNX Runtime
sessions side by side on unseen shapes, passes alternating, every call timed.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import collections
import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tunetree.backends.export_context import attention_as_eager

from .. import common, runner_overhead
from ..common.interleave import interleaved_passes

HOST = torch.device("cpu")


VARIANTS: dict[str, Callable[[], Any]] = {
    "plain export": contextlib.nullcontext,
    "tunetree's guard": attention_as_eager,
}


def _nodes(folder: Path) -> str:
    """The exported graph's node count, and the ops the guard adds."""
    import onnx

    (path,) = folder.glob("*.onnx")
    ops = collections.Counter(node.op_type for node in onnx.load(str(path)).graph.node)
    kinds = ", ".join(f"{k} {ops[k]}" for k in ("ReduceMax", "Where", "Cast") if ops[k])
    return f"{sum(ops.values())} nodes ({kinds})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    common.header(common.command_line())
    work = runner_overhead.MODELS["bert"](HOST, False)
    recorded = runner_overhead.subset(runner_overhead.trace(work, 40), 6)
    unseen = runner_overhead.unseen_calls(work, recorded, 6)
    approaches = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, variant) in enumerate(VARIANTS.items()):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            with variant():
                approaches[name] = runner_overhead.onnxruntime_by_hand(work, recorded, folder)
            print(f"{name}: {_nodes(folder)}")
        stats = interleaved_passes(approaches, unseen, HOST, args.rounds)
    plain = stats["plain export"].median_s
    print(f"| {work.name}, ONNX Runtime, unseen shapes | ms per call (quartiles) | over plain |")
    print("|---|---|---|")
    for name, stat in stats.items():
        quartiles = f"{stat.q1_s * 1e3:.3f}-{stat.q3_s * 1e3:.3f}"
        print(f"| {name} | {stat.median_s * 1e3:.3f} ({quartiles}) | {stat.median_s / plain:.3f} |")


if __name__ == "__main__":
    main()
