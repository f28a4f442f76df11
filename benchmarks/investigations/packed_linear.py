"""Where a CPU decode step could gain at fp32: its linear layers, plain or prepacked (issue 28).

Run: ``python -m benchmarks.investigations.packed_linear --model llama-0.1b --batches 1,4,8``
(alone on the
machine).

A decode step's time is mostly its matrix products (74% of eager's batch-4 step of the 0.1B
Llama on the 2-core Intel Xeon, under ``torch.profiler``), and at batch 1 they already read
the weights near the machine's bandwidth (``benchmarks.generate`` prints that roofline on the
CPU). At batch 4 and 8 plain ``F.linear`` reads them at half that speed. This script times,
side by side in one run, every linear layer of the model at each batch size (one row per
token) with plain ``F.linear`` and with oneDNN's prepacked weights
(``torch.ops.mkldnn._linear_pointwise`` on ``_reorder_linear_weight``: what Inductor's CPU
freezing uses), the same fp32 arithmetic in another order. Rounds alternate the two; medians
of the rounds; the largest absolute difference between their outputs is printed beside.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import functools
import os
import statistics

import torch
from torch import nn

from .. import common
from ..common.generate_models import configs
from ..common.interleave import timed

HOST = torch.device("cpu")


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def _pass(
    layers: list[nn.Linear], inputs: list[torch.Tensor], packed: list[torch.Tensor] | None
) -> list[torch.Tensor]:
    """One call of every layer (what one decode step does), plain or prepacked."""
    outputs = []
    for i, (layer, x) in enumerate(zip(layers, inputs, strict=True)):
        if packed is None:
            outputs.append(torch.nn.functional.linear(x, layer.weight, layer.bias))
        else:
            outputs.append(
                torch.ops.mkldnn._linear_pointwise(x, packed[i], layer.bias, "none", [], "")
            )
    return outputs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="llama-0.1b")
    p.add_argument("--batches", default="1,4,8")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    print(common.header(common.command_line()))
    if not torch.backends.mkldnn.is_available():
        raise SystemExit("this torch build has no oneDNN (mkldnn): nothing to compare")
    torch.manual_seed(0)
    model = configs("cpu", False)[args.model]().eval()
    layers = _linears(model)
    nbytes = sum(layer.weight.nbytes for layer in layers)
    print(f"{args.model}: {len(layers)} linear layers, {nbytes / 1e6:.0f} MB of weights")
    print("| batch | plain F.linear ms | prepacked ms | plain / prepacked | plain GB/s | "
          "prepacked GB/s | largest difference |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    with torch.no_grad():
        for batch in (int(b) for b in args.batches.split(",")):
            inputs = [torch.randn(batch, layer.in_features) for layer in layers]
            packed = [torch.ops.mkldnn._reorder_linear_weight(m.weight, batch) for m in layers]
            plain_out, packed_out = _pass(layers, inputs, None), _pass(layers, inputs, packed)
            diff = max(
                (a - b).abs().max().item() for a, b in zip(plain_out, packed_out, strict=True)
            )
            times: dict[str, list[float]] = {"plain": [], "packed": []}
            for r in range(args.rounds):
                order = ("plain", "packed") if r % 2 == 0 else ("packed", "plain")
                for name in order:
                    use = None if name == "plain" else packed
                    times[name].append(timed(functools.partial(_pass, layers, inputs, use), HOST))
            plain, fast = (statistics.median(times[n]) for n in ("plain", "packed"))
            speeds = f"{nbytes / plain / 1e9:.1f} | {nbytes / fast / 1e9:.1f}"
            print(f"| {batch} | {plain * 1e3:.2f} | {fast * 1e3:.2f} | {plain / fast:.2f} | "
                  f"{speeds} | {diff:.2e} |")  # fmt: skip
    print(f"load average after the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
