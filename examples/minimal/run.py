"""Minimal example: tune a small MLP with a two-backend strategy and check its output.

Run: python examples/minimal/run.py
"""

from __future__ import annotations

import torch

import tunetree as tt


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)
    ).eval()
    data = [torch.randn(16, 256) for _ in range(3)]

    strategy = tt.HighestThroughputStrategy([tt.backends.Inductor(), tt.backends.Eager()])
    result = tt.tune(model, data, depth=0, strategy=strategy)
    print(result)

    fast = result.model  # always call result.model
    with torch.no_grad():
        for x in data:
            expected = model(x)
            got = fast(x)
            assert torch.allclose(got, expected, atol=1e-4, rtol=1e-3), "outputs differ"
    print("outputs match the untuned model")


if __name__ == "__main__":
    main()
