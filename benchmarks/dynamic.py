"""Shapes that vary: a serving trace with varying batch and sequence length, run by every
approach side by side (issue 12 part 8).

Models (random weights, built from configs): BERT 4 layers h256 and GPT-2 4 layers h256 (prefill:
the whole prompt in one forward) with batch 1-32 and sequence 8-256, and a CNN with batch 1-64.
Approaches, each over the whole trace:

- ``eager``: the model as it is;
- ``compile-dynamic``: ``torch.compile(model, dynamic=True)``;
- ``compile-default``: ``torch.compile(model)`` (recompiles for new shapes: counted);
- ``openvino-manual``: exported by hand once with ``torch.export`` Dims over the trace's
  ranges and converted to OpenVINO (CPU only);
- ``tunetree``: ``tt.auto_tune(model, subset)`` on 6 calls of the trace (for every axis a
  call at its smallest and at its largest size, then others); calls outside what it tuned
  fall back to eager (counted).

Reported per approach: steady time for the whole trace (median of passes, measured by
``candidates.measure`` with one pass per block), ratio to eager, the first pass (compiles
included), graphs built (Dynamo's compiled graphs; tunetree's candidate builds), calls of one
pass that ran the original forward at a tuned module, tuning or export time, and the
largest difference from eager's outputs over the trace. Run ``python benchmarks/dynamic.py
--quick`` to check it works; real numbers need an idle machine.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import dataclasses
import os
import random
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import tunetree as tt
from tunetree._util.table import format_seconds, format_table
from tunetree.candidates.measure import MeasureConfig, measure
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.graph import Sample, detach_clone
from tunetree.signature.modules import synchronize

from . import common


@dataclasses.dataclass(frozen=True)
class Workload:
    """One model and its serving trace: ``make(batch, seq)`` builds one call's inputs."""

    name: str
    model: nn.Module
    make: Callable[[int, int], Sample]
    batch: tuple[int, int]
    seq: tuple[int, int] | None
    """Sequence length range, or None for models without one (the CNN)."""


def _tokens(vocab: int, device: torch.device, mask: bool) -> Callable[[int, int], Sample]:
    def make(batch: int, seq: int) -> Sample:
        kwargs = {"input_ids": torch.randint(0, vocab, (batch, seq), device=device)}
        if mask:
            kwargs["attention_mask"] = torch.ones(batch, seq, dtype=torch.long, device=device)
        return Sample((), kwargs)

    return make


def bert(device: torch.device, quick: bool) -> Workload:
    import transformers

    config = transformers.BertConfig(
        num_hidden_layers=2 if quick else 4,
        hidden_size=64 if quick else 256,
        num_attention_heads=4,
        intermediate_size=128 if quick else 1024,
        vocab_size=1000 if quick else 30522,
    )
    model = transformers.BertModel(config).eval().to(device)
    seq = (8, 32) if quick else (8, 256)
    batch = (1, 8) if quick else (1, 32)
    return Workload("BERT-4L h256", model, _tokens(config.vocab_size, device, True), batch, seq)


def gpt2(device: torch.device, quick: bool) -> Workload:
    import transformers

    config = transformers.GPT2Config(
        n_layer=2 if quick else 4,
        n_embd=64 if quick else 256,
        n_head=4,
        vocab_size=1000 if quick else 50257,
        n_positions=256,
        use_cache=False,
    )
    model = transformers.GPT2Model(config).eval().to(device)
    seq = (8, 32) if quick else (8, 256)
    batch = (1, 8) if quick else (1, 32)
    return Workload(
        "GPT-2 4L h256 prefill", model, _tokens(config.vocab_size, device, True), batch, seq
    )


def cnn(device: torch.device, quick: bool) -> Workload:
    width = 8 if quick else 32
    model = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 4 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, 10),
    )
    model = model.eval().to(device)
    size = 32 if quick else 64

    def make(batch: int, _: int) -> Sample:
        return Sample((torch.randn(batch, 3, size, size, device=device),))

    return Workload("CNN 3x64x64", model, make, (1, 16) if quick else (1, 64), None)


MODELS: dict[str, Callable[[torch.device, bool], Workload]] = {
    "bert": bert,
    "gpt2": gpt2,
    "cnn": cnn,
}


def trace(work: Workload, calls: int, seed: int = 0) -> list[Sample]:
    """The serving trace: batch and sequence length drawn uniformly from their ranges."""
    rng = random.Random(seed)
    out = []
    for _ in range(calls):
        batch = rng.randint(*work.batch)
        seq = rng.randint(*work.seq) if work.seq else 0
        out.append(work.make(batch, seq))
    return out


def subset(calls: list[Sample], n: int = 6) -> list[Sample]:
    """``n`` calls to tune on: for every axis, a call with its smallest and one with its largest
    size (so the ranges auto_tune infers span the trace, as a user's real sample would), then
    others spread over the trace."""
    shapes = [[tuple(t.shape) for t in _tensors(s)] for s in calls]
    chosen: list[int] = []
    for leaf, axis in {
        (i, a) for shape in shapes for i, dims in enumerate(shape) for a in range(len(dims))
    }:
        sizes = [shape[leaf][axis] for shape in shapes]
        for pick in (sizes.index(min(sizes)), sizes.index(max(sizes))):
            if pick not in chosen and len(chosen) < n:
                chosen.append(pick)
    step = max(1, len(calls) // (n - 1))
    for i in range(0, len(calls), step):
        if len(chosen) >= n:
            break
        if i not in chosen:
            chosen.append(i)
    return [calls[i] for i in sorted(chosen)]


def _tensors(sample: Sample) -> list[torch.Tensor]:
    leaves = [*sample.args, *(sample.kwargs[k] for k in sorted(sample.kwargs))]
    return [t for t in leaves if isinstance(t, torch.Tensor)]


@dataclasses.dataclass
class Approach:
    """One way of serving the trace, ready to call."""

    name: str
    fn: Callable[..., Any]
    setup_s: float = 0.0
    builds: Callable[[], int | None] = lambda: None
    fallbacks: Callable[[], int | None] = lambda: None
    note: str = ""


def _unique_graphs() -> int:
    import torch._dynamo.utils as dynamo_utils

    return int(dynamo_utils.counters["stats"]["unique_graphs"])


def compiled(name: str, model: nn.Module, **options: Any) -> Approach:
    """``torch.compile`` of the model; builds are the graphs Dynamo compiled for it."""
    torch._dynamo.reset()
    start = _unique_graphs()
    fn = torch.compile(model, **options)
    return Approach(name, fn, builds=lambda: _unique_graphs() - start)


def reduce_overhead(model: nn.Module) -> Approach:
    """``torch.compile(mode="reduce-overhead")`` (CUDA graphs), outputs cloned between calls: a
    replay overwrites the previous call's outputs, and a caller keeping them needs copies."""
    inner = compiled("compile-reduce-overhead", model, mode="reduce-overhead")

    def run(*args: Any, **kwargs: Any) -> Any:
        return detach_clone(inner.fn(*args, **kwargs))

    return dataclasses.replace(inner, fn=run)


def openvino_manual(work: Workload, calls: list[Sample], device: torch.device) -> Approach:
    """Export once with Dims over the trace's ranges, convert to OpenVINO, compile for CPU."""
    if device.type != "cpu":
        raise RuntimeError("OpenVINO runs on the CPU here")
    import openvino

    start = time.perf_counter()
    example = max(calls, key=lambda s: sum(t.numel() for t in [*s.args, *s.kwargs.values()]))
    batch = torch.export.Dim("batch", min=work.batch[0], max=work.batch[1])
    if work.seq is None:
        dynamic: Any = ({0: batch},)
    else:
        seq = torch.export.Dim("seq", min=work.seq[0], max=work.seq[1])
        dynamic = {name: {0: batch, 1: seq} for name in example.kwargs}
    with torch.no_grad():
        exported = torch.export.export(
            work.model, tuple(example.args), dict(example.kwargs), dynamic_shapes=dynamic
        )
    compiled_model = openvino.Core().compile_model(
        openvino.convert_model(exported), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    request = compiled_model.create_infer_request()
    names = list(example.kwargs)

    def run(*args: Any, **kwargs: Any) -> Any:
        inputs = [a.numpy() for a in args] + [kwargs[n].numpy() for n in names]
        result = request.infer(inputs, share_inputs=True, share_outputs=False)
        return torch.from_numpy(result.to_tuple()[0])

    return Approach("openvino-manual", run, setup_s=time.perf_counter() - start, builds=lambda: 1)


def tunetree_auto(
    work: Workload, calls: list[Sample], quick: bool, max_depth: int | None
) -> Approach:
    """``tt.auto_tune`` on a 6-call subset; fallbacks counted at every dispatcher."""
    config = MeasureConfig.quick() if quick else None
    start = time.perf_counter()
    data = [dict(s.kwargs) if s.kwargs else s.args[0] for s in subset(calls)]
    result = tt.auto_tune(
        work.model, data, max_depth=max_depth, measure_config=config, verbose=False, cache=False
    )
    setup = time.perf_counter() - start
    counter = _count_fallbacks(result.model)
    builds = {
        (g.path, str(g.graph.key), row.backend.name)
        for graphs in result.graphs.values()
        for g in graphs
        for row in g.rows
        if row.build_s is not None
    }
    return Approach(
        "tunetree",
        result.model,
        setup_s=setup,
        builds=lambda: len(builds),
        fallbacks=lambda: counter["calls"] if counter["wrapped"] else None,
        note=f"depth {result.depth}: {_winners(result)}",
    )


def _winners(result: tt.AutoTuneResult) -> str:
    """The backends serving the selected depth, e.g. ``openvino x1``."""
    if result.depth is None:
        return "untuned"
    names: dict[str, int] = {}
    for graph in result.graphs.get(result.depth, []):
        name = graph.winner.backend.name if graph.winner is not None else "original"
        names[name] = names.get(name, 0) + 1
    return ", ".join(f"{n} x{c}" for n, c in sorted(names.items()))


class _CountingForward:
    """A dispatcher's original forward that counts the calls it serves (the fallbacks)."""

    def __init__(self, forward: Any, counter: dict[str, int]) -> None:
        self.forward = forward
        self.counter = counter
        self.__self__ = forward.__self__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.counter["calls"] += 1
        return self.forward(*args, **kwargs)


def _count_fallbacks(model: Any) -> dict[str, int]:
    counter = {"calls": 0, "wrapped": 0}
    modules = model.modules() if isinstance(model, nn.Module) else []
    for module in modules:
        dispatcher = dispatcher_of(module)
        if dispatcher is not None and hasattr(dispatcher, "original"):
            dispatcher.original = _CountingForward(dispatcher.original, counter)  # type: ignore[assignment]
            counter["wrapped"] += 1
    return counter


def _first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    if isinstance(output, dict):
        return next(iter(output.values()))
    return output[0]


def run_trace(fn: Callable[..., Any], calls: list[Sample]) -> list[Any]:
    with torch.no_grad():
        return [fn(*s.args, **s.kwargs) for s in calls]


def evaluate(
    approach: Approach,
    calls: list[Sample],
    eager: list[torch.Tensor],
    device: torch.device,
    config: MeasureConfig,
) -> dict[str, Any]:
    """First pass (compiles included), correctness against eager, then steady passes."""
    before = approach.fallbacks()
    synchronize(device)
    start = time.perf_counter()
    outputs = run_trace(approach.fn, calls)
    synchronize(device)
    first = time.perf_counter() - start
    after = approach.fallbacks()
    fallbacks = None if before is None or after is None else after - before
    diff = max(
        float((_first_tensor(o).float().cpu() - e).abs().max())
        for o, e in zip(outputs, eager, strict=True)
    )
    timing = measure({approach.name: lambda: run_trace(approach.fn, calls)}, device, config)[
        approach.name
    ]
    return {
        "approach": approach.name,
        "trace_s": timing.median_s,
        "spread": timing.spread,
        "first_pass_s": first,
        "setup_s": approach.setup_s,
        "builds": approach.builds(),
        "fallback_calls": fallbacks,
        "max_abs_diff": diff,
        "note": approach.note,
    }


def approaches(
    work: Workload, calls: list[Sample], device: torch.device, quick: bool, max_depth: int | None
) -> list[tuple[str, Callable[[], Approach]]]:
    return [
        ("eager", lambda: Approach("eager", work.model)),
        ("compile-dynamic", lambda: compiled("compile-dynamic", work.model, dynamic=True)),
        ("compile-default", lambda: compiled("compile-default", work.model)),
        *(
            [("compile-reduce-overhead", lambda: reduce_overhead(work.model))]
            if device.type == "cuda"
            else []
        ),
        ("openvino-manual", lambda: openvino_manual(work, calls, device)),
        ("tunetree", lambda: tunetree_auto(work, calls, quick, max_depth)),
    ]


def run_model(
    name: str,
    device: torch.device,
    quick: bool,
    n_calls: int,
    max_depth: int | None,
    only: set[str] | None = None,
) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    work = MODELS[name](device, quick)
    calls = trace(work, n_calls)
    with torch.no_grad():
        eager = [_first_tensor(o).float().cpu() for o in run_trace(work.model, calls)]
    passes = 2 if quick else 5
    config = MeasureConfig(
        warmup_s=0.0,
        min_warmup_calls=1,
        block_s=0.0,
        trials=passes,
        min_trials=passes,
        max_s_per_candidate=1e9,
    )
    rows: list[dict[str, Any]] = []
    for name, make in approaches(work, calls, device, quick, max_depth):
        if only and name not in only:
            continue
        try:
            row = evaluate(make(), calls, eager, device, config)
        except Exception as exc:  # an approach that cannot run here gets a row saying why
            row = {"approach": name, "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        row["model"] = work.name
        rows.append(row)
        print(f"  {work.name}: {name}: {row}", flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    eager = {r["model"]: r.get("trace_s") for r in rows if r["approach"] == "eager"}
    lines = []
    for r in rows:
        if "error" in r:
            lines.append([r["model"], r["approach"], "-", "-", "-", "-", "-", "-", "-", r["error"]])
            continue
        base = eager.get(r["model"])
        lines.append(
            [
                r["model"],
                r["approach"],
                format_seconds(r["trace_s"]),
                f"{base / r['trace_s']:.2f}x" if base else "-",
                format_seconds(r["first_pass_s"]),
                "-" if r["builds"] is None else r["builds"],
                "-" if r["fallback_calls"] is None else r["fallback_calls"],
                format_seconds(r["setup_s"]) if r["setup_s"] else "-",
                f"{r['max_abs_diff']:.1e}",
                r["note"],
            ]
        )
    return format_table(
        [
            "model",
            "approach",
            "trace",
            "vs eager",
            "first pass",
            "builds",
            "fallbacks",
            "tuning",
            "max diff",
            "note",
        ],
        lines,
    )


def main() -> None:
    p = common.parser(__doc__.splitlines()[0], list(MODELS))
    p.add_argument(
        "--calls", type=int, default=None, help="calls in the trace (default 48, quick 12)"
    )
    p.add_argument(
        "--max-depth",
        type=int,
        default=None,
        help="deepest cut auto_tune tries (default: every depth; --quick: 0)",
    )
    p.add_argument(
        "--approaches",
        default=None,
        help="comma-separated approaches to run (default: all; eager always runs)",
    )
    args = p.parse_args()
    only = None if args.approaches is None else {"eager", *args.approaches.split(",")}
    if args.quick and args.max_depth is None:
        args.max_depth = 0
    info = common.header(common.command_line())
    common.cuda_setup(args.device)
    device = torch.device(args.device)
    n_calls = args.calls or (12 if args.quick else 48)
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        rows.extend(run_model(name.strip(), device, args.quick, n_calls, args.max_depth, only))
    print(table(rows))
    print(f"# load average after the run: {os.getloadavg()[0]:.2f}")
    common.write_json(
        args.out, f"dynamic-{common.size_for(args)}.json", {"info": info, "rows": rows}
    )


if __name__ == "__main__":
    main()
