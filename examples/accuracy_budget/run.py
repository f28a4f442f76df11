"""Accuracy budget example: a classifier tuned under a task-metric budget (results change).

Run: python examples/accuracy_budget/run.py

1. a small transformer classifier and a labelled validation set are built from code;
2. ``tt.auto_tune(..., accuracy=tt.AccuracyBudget(max_drop=..., evaluate=accuracy_on_val))``
   adds reduced-precision candidates where this machine has them, measures each one's error,
   and keeps the fastest plan whose validation accuracy falls by at most ``max_drop``
   (and whose outputs stay within ``max_error`` relative L2 of fp32 eager);
3. ``result.pareto()`` prints every plan checked: latency against error.
"""

from __future__ import annotations

import torch

import tunetree as tt


class Classifier(torch.nn.Module):
    def __init__(self, width: int = 128, classes: int = 10) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


def main() -> None:
    torch.manual_seed(0)
    model = Classifier().eval()
    data = [torch.randn(8, 64, 128) for _ in range(4)]  # the calls to tune on (1 held out)
    val_x = [torch.randn(8, 64, 128) for _ in range(4)]
    with torch.no_grad():  # labels: what the fp32 model predicts, so its accuracy is 1.0
        val_y = [model(x).argmax(-1) for x in val_x]

    def accuracy_on_val(m: torch.nn.Module) -> float:
        hits = sum(int((m(x).argmax(-1) == y).sum()) for x, y in zip(val_x, val_y, strict=True))
        return hits / sum(len(y) for y in val_y)

    budget = tt.AccuracyBudget(max_error=2e-2, max_drop=0.02, evaluate=accuracy_on_val)
    result = tt.auto_tune(model, data, accuracy=budget, quick=True, max_depth=1)
    print(result)
    if result.depth is not None:
        print(result.pareto())
    print(f"validation accuracy: untuned 1.000, tuned {accuracy_on_val(result.model):.3f}")
    assert accuracy_on_val(result.model) >= 1.0 - budget.max_drop - 1e-9


if __name__ == "__main__":
    main()
