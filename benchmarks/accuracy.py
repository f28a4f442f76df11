"""Accuracy budget (issue 17): what a stated error buys, side by side with the default tune.

    python -m benchmarks.accuracy --device cpu --models encoder,bert --out benchmarks/results/x
    python -m benchmarks.accuracy --device cuda --models bert --sizes 8x128,32x256
    python -m benchmarks.accuracy --quick --models mlp                  # a smoke run

Per model: ``tt.auto_tune`` with its default (results kept) and with
``accuracy=tt.AccuracyBudget(max_error=...)``, then eager and both tuned models are measured
end to end in one interleaved ``candidates.measure`` call, so their speed-ups are side-by-side
ratios. The error column is the relative L2 error of each tuned model's outputs against fp32
eager on inputs neither tune saw. ``--sizes`` (``BxT`` for token models) rebuilds the inputs of
``bert`` (4 layers, hidden 768 on CUDA, 256 on CPU) at those sizes. The load average is
printed: run it alone on an idle machine. Results go to ``--out`` as JSON and markdown.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import os
import time
from pathlib import Path
from typing import Any

import torch
import transformers

import tunetree as tt
from tunetree.accuracy import output_error
from tunetree.candidates.measure import cycle_calls, measure
from tunetree.signature.graph import as_samples
from tunetree.signature.modules import run_model

from . import common
from .common.models import ZooModel, build


def bert_at(device: str, batch: int, seq: int, quick: bool) -> ZooModel:
    """BERT, 4 layers (hidden 768 on CUDA, 256 on CPU, 64 quick), four calls of one size."""
    hidden = 64 if quick else (768 if device == "cuda" else 256)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=hidden,
        num_hidden_layers=2 if quick else 4,
        num_attention_heads=max(hidden // 64, 1),
        intermediate_size=4 * hidden,
    )
    model = transformers.BertModel(config).to(device).eval()
    data = []
    for _ in range(4):
        ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        data.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    return ZooModel(f"bert {batch}x{seq}", model, data, True)


def unseen_like(entry: ZooModel) -> list[Any]:
    """Inputs of the same shapes and kinds as the model's, drawn afresh."""
    torch.manual_seed(12345)

    def fresh(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return torch.randn_like(value)
        if isinstance(value, torch.Tensor) and value.dtype == torch.long and value.max() > 1:
            return torch.randint_like(value, int(value.max()) + 1)
        if isinstance(value, dict):
            return {k: fresh(v) for k, v in value.items()}
        return value

    return [fresh(item) for item in entry.data[:2]]


def run(entry: ZooModel, args: Any) -> dict[str, Any]:
    """Both tunes of one model, then one interleaved end-to-end measurement of all three."""
    budget = tt.AccuracyBudget(max_error=args.max_error)
    tuned: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    for label, kw in (("default", {}), (f"budget {args.max_error:g}", {"accuracy": budget})):
        start = time.perf_counter()
        result = tt.auto_tune(
            entry.model, entry.data, max_depth=args.max_depth, verbose=False, cache=False, **kw
        )
        wall = time.perf_counter() - start
        print(f"\n### {entry.name}: {label}\n{result}", flush=True)
        if "accuracy" in kw and result.depth is not None:
            print(result.pareto())
        tuned[label] = result.model
        rows[label] = {
            "tuning_s": wall,
            "depth": result.depth,
            "plan": sorted({e.backend.name for e in result.plan.entries}),
        }
    samples = as_samples(entry.data)
    unseen = [s.to(args.device) for s in as_samples(unseen_like(entry))]
    with torch.no_grad():
        reference = [run_model(entry.model, s, None) for s in unseen]
        for label, model in tuned.items():
            got = [run_model(model, s, None) for s in unseen]
            rows[label]["unseen_rel_l2"] = output_error(reference, got, "rel_l2")

    def caller(model: Any) -> Any:
        return lambda *a, **k: model(*a, **k)

    calls = {"eager": caller(entry.model), **{k: caller(m) for k, m in tuned.items()}}
    config = tt.MeasureConfig.quick() if args.quick else tt.MeasureConfig()
    timings = measure({k: cycle_calls(fn, samples) for k, fn in calls.items()}, args.device, config)
    eager = timings["eager"].median_s
    for label in tuned:
        rows[label]["latency_s"] = timings[label].median_s
        rows[label]["speedup"] = eager / timings[label].median_s
    return {"model": entry.name, "eager_s": eager, "approaches": rows}


def markdown(payload: dict[str, Any]) -> str:
    info = payload["info"]
    lines = [
        "# Accuracy budget",
        "",
        f"{info['date']}, `{info['command']}`, torch {info['torch']}, {info['cpu_count']} CPUs, "
        f"GPU {info['gpu']}, load average {info['load_average_1m']:.2f}",
        "",
        "| model | approach | latency | speed-up (side by side) | unseen rel_l2 | tuning s | "
        "depth | plan |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in payload["models"]:
        lines.append(
            f"| {m['model']} | eager | {m['eager_s'] * 1e3:.3f} ms | 1.00x | 0 | - | - | |"
        )
        for label, r in m["approaches"].items():
            lines.append(
                f"| {m['model']} | {label} | {r['latency_s'] * 1e3:.3f} ms | {r['speedup']:.2f}x "
                f"| {r['unseen_rel_l2']:.2g} | {r['tuning_s']:.1f} | {r['depth']} | "
                f"{', '.join(r['plan'])} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = common.parser(__doc__.splitlines()[0], ["encoder", "bert"])
    p.add_argument("--max-error", type=float, default=1e-2, help="the budget's rel_l2 bound")
    p.add_argument("--max-depth", type=int, default=1, help="auto_tune's max_depth")
    p.add_argument("--sizes", default=None, help="BxT sizes for bert, comma-separated")
    args = p.parse_args()
    common.cuda_setup(args.device)
    info = common.header(common.command_line())
    entries = []
    for name in args.models.split(","):
        if name == "bert" and args.sizes:
            for size in args.sizes.split(","):
                batch, seq = (int(v) for v in size.split("x"))
                entries.append(bert_at(args.device, batch, seq, args.quick))
        else:
            entries.append(build(name, common.size_for(args), args.device))
    payload = {"info": info, "models": [run(entry, args) for entry in entries]}
    payload["info"]["load_average_after"] = os.getloadavg()[0]
    text = markdown(payload)
    print("\n" + text)
    common.write_json(args.out, f"accuracy-{args.device}.json", payload)
    if args.out is not None:
        Path(args.out, f"accuracy-{args.device}.md").write_text(text)


if __name__ == "__main__":
    main()
