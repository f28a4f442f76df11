"""A tuned model inside a serving process (issue 30), side by side in one run.

Run: ``python -m benchmarks.serving [--device cpu|cuda] [--sections other,overhead,auto]
[--models convhead,bert,mlp,cnn] [--budget S] [--rounds N] [--deadline-s S] [--quick]
[--out DIR]``. It prints three markdown tables (and writes them to ``DIR/serving_<device>.md``
with the rows as JSON):

1. ``other``: **the user's other work right after a tuned call.** A serving process always
   runs something between calls (tokenizer, post-processing, another model). Here that work
   is an eager MLP (``OtherWork``: 16x64x256 through 1024 and back, about 5 ms on two
   cores). Per round, each approach runs one tuned call, untimed, and then the other work,
   timed; ``alone`` runs the other work after the other work. Approaches: ``auto_tune``'s
   selection, every default backend forced at depth 0 (``OneBackendStrategy``), and on the
   CPU ONNX Runtime at depth 0 after ``tt.serve_alone`` (its threads spin: what a
   dedicated process may ask for, shown for contrast). Also the tuned call itself (timed right
   after the other work) and the step, call plus other work.
2. ``overhead``: **tunetree's runner against the same backend by hand** (the by-hand setups of
   :mod:`benchmarks.runner_overhead`: one export over the same ranges, numpy in and out;
   ``torch.compile(dynamic=True)``; CUDA graphs captured per shape), both tuned or built on
   six recorded calls and timed on six unseen calls inside the ranges. The harder method:
   the two alternate one pass over the six calls at a time, every call timed, no untimed
   call before a pass, so each pass starts right after the other approach's (see
   ``benchmarks/README.md``, "Two ways to time a runner").
3. ``auto``: **auto_tune's selection against every whole-model backend**, each tuned alone
   at depth 0, and eager, passes over the recorded calls alternating.

All three interleave their approaches round by round in a rotating order and take medians;
ratios are within one run. ``--device cuda`` runs Inductor and CUDA graphs (``DeviceGraph``)
against ``torch.compile(dynamic=True)`` and CUDA graphs by hand, the overhead section first;
``--deadline-s`` (default 330 on CUDA) skips what would start after it, and says so, so the
run ends in about six minutes on an H200.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import dataclasses
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tunetree as tt
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.graph import Sample

from . import common
from .common.interleave import Stat, interleaved_passes, paired, rotations, timed
from .dynamic import Workload, cnn, subset, trace
from .runner_overhead import BACKENDS, bert2, by_hand, mlp, runner_eager_calls, unseen_calls


class ConvHead(nn.Module):
    """A convolution stem and a transformer head (the issue's model): 8x3x64x64 images."""

    def __init__(self, width: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width // 2, 3, stride=2, padding=1),
            nn.BatchNorm2d(width // 2),
            nn.ReLU(),
            nn.Conv2d(width // 2, width, 3, stride=2, padding=1),
            nn.ReLU(),
        )
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True)
        self.head = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.stem(x).flatten(2).transpose(1, 2)
        return self.out(self.head(tokens).mean(dim=1))


def convhead(device: torch.device, quick: bool) -> Workload:
    torch.manual_seed(0)
    model = ConvHead(32 if quick else 64).eval().to(device)
    size = 32 if quick else 64

    def make(batch: int, _: int) -> Sample:
        return Sample((torch.randn(batch, 3, size, size, device=device),))

    return Workload("conv-stem + transformer head", model, make, (8, 8), None)


MODELS: dict[str, Callable[[torch.device, bool], Workload]] = {
    "convhead": convhead,
    "bert": bert2,
    "mlp": mlp,
    "cnn": cnn,
}
SECTION_MODELS = {
    "other": ("convhead", "bert", "mlp"),
    "overhead": ("bert", "mlp", "cnn"),
    "auto": ("convhead", "bert", "mlp"),
}


class OtherWork(nn.Module):
    """The user's own eager work between tuned calls (a stand-in for post-processing)."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x).softmax(-1)


# Timing ------------------------------------------------------------------------------------


def other_work_after(
    approaches: dict[str, Callable[[Sample], Any]],
    other: Callable[[], Any],
    samples: list[Sample],
    device: torch.device,
    rounds: int,
) -> dict[str, tuple[Stat, Stat | None]]:
    """Per approach: the other work timed right after one of its calls, and that call timed
    right after the other work (the step of a serving loop); ``alone``: other work after other
    work. Per round and approach, one untimed step, then a step per sample; the round's value
    is their median."""
    names = ["alone", *approaches]
    after: dict[str, list[float]] = {n: [] for n in names}
    calls: dict[str, list[float]] = {n: [] for n in approaches}
    with torch.no_grad():
        for fn in approaches.values():
            for s in samples:
                fn(s)
        for r, order in enumerate(rotations(names, rounds)):
            for name in order:
                call = approaches.get(name, lambda _: other())
                call(samples[r % len(samples)])  # untimed: what the previous approach left
                other()
                got, took = [], []
                for i in range(len(samples)):
                    sample = samples[(r + i) % len(samples)]
                    took.append(timed(lambda s=sample, f=call: f(s), device))
                    got.append(timed(other, device))
                after[name].append(statistics.median(got))
                if name in calls:
                    calls[name].append(statistics.median(took))
    return {n: (Stat.of(after[n]), Stat.of(calls[n]) if n in calls else None) for n in names}


# Building ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Built:
    """What the sections share: one workload's calls and its tuned and by-hand models."""

    work: Workload
    recorded: list[Sample]
    unseen: list[Sample]
    forced: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Backend kind -> the model tuned with only it at depth 0 (None: it failed, see notes)."""
    auto: tt.AutoTuneResult | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


def forced(built: Built, backend: str, device: torch.device) -> Any:
    """The workload tuned at depth 0 with only ``backend`` (cached; None when not built)."""
    if backend not in built.forced:
        start = time.perf_counter()
        result = tt.tune(
            built.work.model,
            built.recorded,
            depth=0,
            strategy=tt.OneBackendStrategy(BACKENDS[backend]()),
            device=device,
            cache=False,
            verbose=False,
        )
        if dispatcher_of(result.model) is None:
            reasons = "; ".join(r.reason for g in result.graphs for r in g.rows if r.reason)
            built.notes.append(f"{backend} not built: {reasons[:160]}")
            built.forced[backend] = None
        else:
            built.forced[backend] = result.model
            print(f"  {built.work.name}: {backend} tuned in {time.perf_counter() - start:.0f} s")
    return built.forced[backend]


def auto_tuned(built: Built, device: torch.device, budget: float) -> tt.AutoTuneResult:
    if built.auto is None:
        start = time.perf_counter()
        built.auto = tt.auto_tune(
            built.work.model,
            built.recorded,
            device=device,
            time_budget=budget,
            cache=False,
            verbose=False,
        )
        print(f"  {built.work.name}: auto_tune in {time.perf_counter() - start:.0f} s")
        print("    " + str(built.auto).splitlines()[0])
    return built.auto


def describe(result: tt.AutoTuneResult) -> str:
    if result.depth is None:
        return "untuned"
    kinds = sorted({e.backend.kind for e in result.plan.entries})
    return f"depth {result.depth}: {', '.join(kinds)}"


def default_backends(device: torch.device) -> list[str]:
    return (
        ["inductor", "device-graph"]
        if device.type == "cuda"
        else [
            "openvino",
            "onnxruntime",
            "inductor",
        ]
    )


# Sections ------------------------------------------------------------------------------------


def section_other(built: Built, args: Any, device: torch.device) -> list[dict[str, Any]]:
    approaches: dict[str, Callable[[Sample], Any]] = {}
    auto = auto_tuned(built, device, args.budget)
    approaches[f"auto_tune ({describe(auto)})"] = lambda s, m=auto.model: s.run(m)
    for backend in default_backends(device):
        model = forced(built, backend, device)
        if model is not None:
            approaches[f"{backend} at depth 0"] = lambda s, m=model: s.run(m)
    # The control: a call of the untuned model leaves the caches as any call of it would.
    approaches["untuned model (eager)"] = lambda s: s.run(built.work.model)
    torch.manual_seed(1)
    other_model = OtherWork(64 if args.quick else 256).eval().to(device)
    x = torch.randn(16, 64, other_model.mlp[0].in_features, device=device)
    runs = [
        other_work_after(approaches, lambda: other_model(x), built.recorded, device, args.rounds)
    ]
    if device.type == "cpu" and forced(built, "onnxruntime", device) is not None:
        # Measured apart: threads spinning after its calls would slow the next approach.
        spinning = tt.tune(
            built.work.model,
            built.recorded,
            depth=0,
            strategy=tt.OneBackendStrategy(BACKENDS["onnxruntime"]()),
            cache=False,
            verbose=False,
        ).model
        tt.serve_alone(spinning)
        label = "onnxruntime at depth 0, tt.serve_alone (spinning; measured apart)"
        one = {label: lambda s, m=spinning: s.run(m)}
        runs.append(
            other_work_after(one, lambda: other_model(x), built.recorded, device, args.rounds)
        )
    rows = []
    for found in runs:
        alone = found["alone"][0]
        for name, (after, call) in found.items():
            if name == "alone" and rows:
                continue
            rows.append(
                {
                    "model": built.work.name,
                    "approach": name,
                    "call ms": call.text() if call else "-",
                    "other work ms": after.text(),
                    "other / alone": paired(after, alone).ratio_text(),
                    "step ms": f"{1e3 * (after.median_s + (call.median_s if call else 0.0)):.3f}",
                }
            )
    return rows


def section_overhead(built: Built, args: Any, device: torch.device) -> list[dict[str, Any]]:
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="serving-"))
    for backend in default_backends(device):
        model = forced(built, backend, device)
        if model is None:
            continue
        hand = by_hand(backend, built.work, built.recorded, folder)
        dispatcher = dispatcher_of(model)
        assert dispatcher is not None
        runners = list(dispatcher.runners.values())
        fallbacks, eager = dispatcher.fallback_calls, runner_eager_calls(runners)
        stats = interleaved_passes(
            {"by hand": hand, "tunetree": lambda s, m=model: s.run(m)},
            built.unseen,
            device,
            args.rounds,
        )
        rows.append(
            {
                "model": built.work.name,
                "backend": backend,
                "by hand": stats["by hand"].text(),
                "tunetree": stats["tunetree"].text(),
                "tunetree / by hand": paired(stats["tunetree"], stats["by hand"]).ratio_text(),
                "fallbacks": dispatcher.fallback_calls - fallbacks,
                "runner eager calls": runner_eager_calls(runners) - eager,
            }
        )
        print("  " + row_text(rows[-1]))
    return rows


def section_auto(built: Built, args: Any, device: torch.device) -> list[dict[str, Any]]:
    auto = auto_tuned(built, device, args.budget)
    approaches: dict[str, Callable[[Sample], Any]] = {"auto_tune": lambda s: s.run(auto.model)}
    for backend in default_backends(device):
        model = forced(built, backend, device)
        if model is not None:
            approaches[backend] = lambda s, m=model: s.run(m)
    approaches["eager"] = lambda s: s.run(built.work.model)
    stats = interleaved_passes(approaches, built.recorded, device, args.rounds)
    singles = {n: s for n, s in stats.items() if n not in ("auto_tune", "eager")}
    best = min(singles, key=lambda n: singles[n].median_s) if singles else "eager"
    row: dict[str, Any] = {"model": built.work.name, "auto_tune picked": describe(auto)}
    row |= {name: s.text() for name, s in stats.items()}
    row["best single"] = best
    row["auto / best single"] = paired(stats["auto_tune"], stats[best]).ratio_text()
    row["final check"] = auto.final or "-"
    return [row]


SECTIONS = {"other": section_other, "overhead": section_overhead, "auto": section_auto}
TITLES = {
    "other": "The user's other work right after a tuned call (goal: other / alone <= 1.10)",
    "overhead": "tunetree's runner against the same backend by hand, unseen shapes, passes "
    "alternating (goal: <= 1.03)",
    "auto": "auto_tune's selection against each whole-model backend tuned alone "
    "(goal: auto / best single <= 1.03)",
}


def row_text(row: dict[str, Any]) -> str:
    return "| " + " | ".join(cell(v) for v in row.values()) + " |"


def cell(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(nothing measured)"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "-")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (5 min {five:.2f}) on {os.cpu_count()} CPUs"


def defaults(args: Any) -> Any:
    """Per device: the section order (CUDA: the runner overhead first), budgets and rounds."""
    cuda = args.device == "cuda"
    if args.sections is None:
        args.sections = "overhead,auto,other" if cuda else "other,overhead,auto"
    if args.budget is None:
        args.budget = 20.0 if args.quick else 45.0 if cuda else 150.0
    if args.rounds is None:
        args.rounds = 3 if args.quick else 15
    if args.deadline_s is None and cuda:
        args.deadline_s = 330.0  # with the model that would cross it skipped: about 6 minutes
    return args


def main() -> None:
    p = common.parser(__doc__.splitlines()[0], list(MODELS))
    p.add_argument("--sections", default=None, help="comma-separated: other,overhead,auto")
    p.add_argument("--budget", type=float, default=None, help="auto_tune's time budget (s)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per table")
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="start no model expected to end after this (its cost: the longest one so far)",
    )
    args = defaults(p.parse_args())
    common.cuda_setup(args.device)
    device = torch.device(args.device)
    wanted = set(args.models.split(","))
    info = common.header(common.command_line())
    print(f"# {load()}")
    started = time.perf_counter()
    built: dict[str, Built] = {}
    tables: dict[str, list[dict[str, Any]]] = {s: [] for s in args.sections.split(",")}
    skipped: list[str] = []
    longest, report = 0.0, ""
    for section in tables:
        for name in [n for n in SECTION_MODELS[section] if n in wanted]:
            elapsed = time.perf_counter() - started
            if args.deadline_s is not None and elapsed + longest > args.deadline_s:
                skipped.append(
                    f"{section} / {name}: skipped, it would end past --deadline-s "
                    f"{args.deadline_s:.0f} ({elapsed:.0f} s so far, {longest:.0f} s a model)"
                )
                continue
            if name not in built:
                work = MODELS[name](device, args.quick)
                recorded = subset(trace(work, 40), 6)
                built[name] = Built(work, recorded, unseen_calls(work, recorded, 6) or recorded)
            print(f"{section}: {built[name].work.name} ({load()})", flush=True)
            try:
                tables[section] += SECTIONS[section](built[name], args, device)
            except Exception as exc:  # one broken model must not end the run
                skipped.append(f"{section} / {name}: failed: {exc!r}"[:200])
            longest = max(longest, time.perf_counter() - started - elapsed)
            notes = [n for b in built.values() for n in b.notes] + skipped
            report = write_report(args, info, tables, notes, time.perf_counter() - started)
    print("\n" + report)


def write_report(
    args: Any, info: dict[str, Any], tables: dict[str, Any], notes: list[str], took_s: float
) -> str:
    """The markdown report so far (written after every model, so a stopped run keeps it)."""
    text = [f"# Serving benchmark ({args.device})", "", f"`{info['command']}`", ""]
    text += [f"Load average at the start: {info['load_average_1m']:.2f}; now: {load()}.", ""]
    for section, rows in tables.items():
        text += [f"## {TITLES[section]}", "", table(rows), ""]
    text += [f"- {n}" for n in notes]
    text.append(f"\nTotal time {took_s:.0f} s.")
    report = "\n".join(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"serving_{args.device}.md").write_text(report + "\n")
        payload = {"header": info, "tables": tables, "notes": notes}
        (args.out / f"serving_{args.device}.json").write_text(json.dumps(payload, indent=2))
    return report


if __name__ == "__main__":
    main()
