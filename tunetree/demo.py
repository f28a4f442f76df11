"""The demo: auto-tune a built-in 4-layer transformer encoder and print what was measured.

Run: ``python -m tunetree.demo`` (or ``make demo``). It tunes twice: first keeping the model's
results (the default), then, labelled as changing results, under an accuracy budget of 1e-2
relative L2 error (``--accuracy 0`` skips it). Takes a few minutes on a small CPU.
"""

from __future__ import annotations

import argparse
from typing import Literal

import torch

from ._util.args import add_budget_arguments
from .accuracy import AccuracyBudget, output_error
from .search.auto import AutoTuneResult, auto_tune
from .search.tune import TuneResult
from .signature.compare import compare_all


def build_encoder(d_model: int = 256, layers: int = 4) -> torch.nn.Module:
    """The built-in demo model: ``nn.TransformerEncoder`` with random weights."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, batch_first=True)
    return torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of the demo; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-depth", type=int, default=1, help="deepest cut to try")
    add_budget_arguments(parser)
    args = parser.parse_args(argv)
    return run_demo(args.max_depth, args.time_budget, args.quick, args.accuracy)


def run_demo(
    max_depth: int = 1,
    time_budget: float | Literal["default"] | None = "default",
    quick: bool = False,
    accuracy: float = 1e-2,
) -> int:
    """Auto-tune the built-in encoder, print every table; 0 when every check passes.

    The default tune must match eager; the tune under an accuracy budget of ``accuracy``
    (skipped when 0) must hold it on the demo's inputs.
    """
    model = build_encoder()
    data = [torch.randn(8, 128, 256) for _ in range(3)]
    with torch.no_grad():  # before tuning: a deeper depth wraps the model itself in place
        expected = [model(x) for x in data]
    print(
        f"Model: 4-layer nn.TransformerEncoder (d=256), inputs 8x128x256, torch {torch.__version__}"
    )
    print("\n=== 1. Default: results kept (every candidate must match eager) ===")
    result = auto_tune(model, data, max_depth=max_depth, time_budget=time_budget, quick=quick)
    _print_result(result)
    with torch.no_grad():
        check = compare_all(expected, [result.model(x) for x in data])
    print(
        f"\ntuned outputs vs untuned: {'match' if check.ok else check.reason} "
        f"(max abs diff {check.max_abs_diff:.2g})"
    )
    if not accuracy:
        return 0 if check.ok else 1
    result.undo()  # the second tune starts from the untuned model
    budget = AccuracyBudget(max_error=accuracy)
    print(
        f"\n=== 2. Under an accuracy budget ({budget.describe()}): RESULTS CHANGE, opt-in ===\n"
        "Reduced-precision candidates are admitted by their measured error; the plan is checked "
        "end to end, on an input held out from the choice too."
    )
    budgeted = auto_tune(
        model, data, max_depth=max_depth, time_budget=time_budget, quick=True, accuracy=budget
    )
    _print_result(budgeted)
    if budgeted.depth is not None:
        print()
        print(budgeted.pareto())
    with torch.no_grad():
        error = output_error(expected, [budgeted.model(x) for x in data], "rel_l2")
    held = error <= accuracy
    print(
        f"\nbudgeted outputs vs untuned: relative L2 error {error:.2g} "
        f"({'within' if held else 'OVER'} the budget {accuracy:g})"
    )
    return 0 if check.ok and held else 1


def _print_result(result: AutoTuneResult) -> None:
    """The auto-tune table and the candidates of the selected depth."""
    print()
    print(result)
    if result.depth is not None:
        print()
        print(f"Candidates at the selected depth {result.depth}:")
        graphs = result.graphs[result.depth]
        assert result.info is not None
        print(TuneResult(result.model, result.depth, result.plan, graphs, result.info).table())


if __name__ == "__main__":
    raise SystemExit(main())
