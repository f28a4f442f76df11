"""auto_tune example: a four-layer transformer encoder, every cut depth against the untuned model.

Run: python examples/auto_tune/run.py

1. a dry run shows how many modules and graphs every depth would wrap;
2. auto_tune tunes each depth, measures it end to end and keeps the fastest;
3. the winner is saved to a .tt checkpoint, loaded into a freshly built model (no tuning),
   and checked against the untuned model's output.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

import tunetree as tt


def build_encoder() -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval()


def main() -> None:
    model = build_encoder()
    data = [torch.randn(4, 64, 128) for _ in range(3)]
    with torch.no_grad():
        expected = [model(x) for x in data]  # before tuning: deeper cuts wrap in place

    print(tt.auto_tune(model, data, dry_run=True))
    print()

    # Depth 2 wraps 32 small modules; each candidate costs a compile, so keep the demo short.
    result = tt.auto_tune(model, data, max_depth=1, time_budget=600)
    print(result)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "encoder.tt"
        tt.save(result, path)
        print(f"\nsaved {path.name}: {path.stat().st_size / 1e6:.1f} MB")
        loaded = tt.load(build_encoder(), path)

    with torch.no_grad():
        for x, want in zip(data, expected, strict=True):
            assert torch.allclose(loaded(x), want, atol=1e-4, rtol=1e-3), "loaded differs"
            assert torch.allclose(result.model(x), want, atol=1e-4, rtol=1e-3), "tuned differs"
    print("the loaded model matches the untuned model")


if __name__ == "__main__":
    main()
