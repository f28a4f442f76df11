"""What a tuned runner costs beside the same backend used by hand (issue 22).

Run: ``python -m benchmarks.runner_overhead [--device cuda] [--models mlp,bert,cnn]
[--backends openvino,onnxruntime,inductor] [--quick] [--out DIR]``.

For every model and backend, tunetree tunes the model at depth 0 with only that backend
(``OneBackendStrategy``) on six calls of varying shape; beside it the same backend is set up
by hand as a careful user would (one export over the same ranges, numpy in and out, the
backend's own recommended settings). Four ways of serving the same calls are then measured side
by side in one :func:`tunetree.measure` run, on the recorded calls and on unseen calls inside
the ranges:

- ``by hand``: the backend set up by hand;
- ``tunetree``: the tuned model, as a user calls it;
- ``runner``: tunetree's runner for each call's graph, called with the already bound
  arguments (no binding, keying or routing);
- ``artifact``: the backend call on tunetree's own artifact (its OpenVINO model, ONNX session,
  compiled function) with inputs converted beforehand: no tunetree code at all.

``by hand`` and ``tunetree`` are timed in one run of their own, alternating; ``runner`` and
``artifact`` in a second run beside ``tunetree`` (all on tunetree's artifact, so no block
follows another runtime's), and are scaled to the first run by ``tunetree``'s time.

So ``tunetree - runner`` is the dispatcher (binding, keying, routing), ``runner - artifact``
the runner's conversions (picking inputs, numpy views, output tensors, rebuilding eager's
structure), and ``artifact / by hand`` what the artifact and its configuration cost or gain
against the by-hand setup. Goal: ``tunetree / by hand`` at most 1.03 (unseen) and 1.02
(recorded).
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tunetree as tt
from tunetree.backends import Inductor, OnnxRuntime, OpenVINO
from tunetree.backends.base import Backend, Runner
from tunetree.backends.dtypes import as_numpy
from tunetree.graph import GraphKey, Sample
from tunetree.wrap import Dispatcher, dispatcher_of

from . import common
from .dynamic import Workload, _tokens, cnn, subset, trace

Call = Callable[[], Any]


def mlp(device: torch.device, quick: bool) -> Workload:
    width = 64 if quick else 1024
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers).eval().to(device)

    def make(batch: int, _: int) -> Sample:
        return Sample((torch.randn(batch, width, device=device),))

    return Workload(f"MLP 4x{width}", model, make, (1, 32), None)


def bert2(device: torch.device, quick: bool) -> Workload:
    """BERT-2L, hidden 256, with a padded attention mask (the issue's model)."""
    import transformers

    config = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=64 if quick else 256,
        num_attention_heads=4,
        intermediate_size=128 if quick else 1024,
        vocab_size=1000 if quick else 30522,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval().to(device)
    tokens = _tokens(config.vocab_size, device, True)

    def make(batch: int, seq: int) -> Sample:
        sample = tokens(batch, seq)
        mask = sample.kwargs["attention_mask"].clone()
        mask[-1, seq // 2 :] = 0  # one padded row
        return Sample((), {**sample.kwargs, "attention_mask": mask})

    return Workload("BERT-2L h256", model, make, (1, 16), (16, 128) if not quick else (8, 32))


MODELS: dict[str, Callable[[torch.device, bool], Workload]] = {
    "mlp": mlp,
    "bert": bert2,
    "cnn": cnn,
}


def _dynamic_shapes(work: Workload, example: Sample, calls: list[Sample]) -> Any:
    """``torch.export`` dims over the calls' own batch (and sequence) ranges."""
    batches = [_first(s).shape[0] for s in calls]
    batch = torch.export.Dim("batch", min=min(batches), max=max(batches))
    if work.seq is None:
        return ({0: batch},)
    lengths = [_first(s).shape[1] for s in calls]
    seq = torch.export.Dim("seq", min=min(lengths), max=max(lengths))
    return {name: {0: batch, 1: seq} for name in example.kwargs}


def _first(sample: Sample) -> torch.Tensor:
    return sample.args[0] if sample.args else next(iter(sample.kwargs.values()))


def _numpy_inputs(sample: Sample) -> list[Any]:
    return [as_numpy(t) for t in (*sample.args, *sample.kwargs.values())]


def _largest(calls: list[Sample]) -> Sample:
    return max(calls, key=lambda s: sum(t.numel() for t in (*s.args, *s.kwargs.values())))


def openvino_by_hand(work: Workload, calls: list[Sample]) -> Callable[[Sample], Any]:
    """``torch.export`` with Dims, ``convert_model``, ``compile_model`` f32, numpy in and out."""
    import openvino

    example = _largest(calls)
    with torch.no_grad():
        exported = torch.export.export(
            work.model,
            tuple(example.args),
            dict(example.kwargs),
            dynamic_shapes=_dynamic_shapes(work, example, calls),
        )
    compiled = openvino.Core().compile_model(
        openvino.convert_model(exported), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    request = compiled.create_infer_request()

    def run(sample: Sample) -> Any:
        result = request.infer(_numpy_inputs(sample), share_inputs=True, share_outputs=False)
        return tuple(torch.from_numpy(v) for v in result.to_tuple())

    return run


def onnxruntime_by_hand(
    work: Workload, calls: list[Sample], folder: Path
) -> Callable[[Sample], Any]:
    """The dynamo ONNX exporter with Dims, a default CPU session, numpy in and out."""
    import onnxruntime

    example = _largest(calls)
    path = folder / f"{work.name.split()[0]}.onnx"
    with torch.no_grad():
        torch.onnx.export(
            work.model,
            tuple(example.args),
            str(path),
            kwargs=dict(example.kwargs),
            dynamo=True,
            dynamic_shapes=_dynamic_shapes(work, example, calls),
            verbose=False,
            report=False,
        )
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(sample: Sample) -> Any:
        # positional inputs take the exported graph's names in order, keywords their own
        values = dict(
            zip(names if sample.args else sample.kwargs, _numpy_inputs(sample), strict=False)
        )
        feeds = {name: values[name] for name in names if name in values}
        return tuple(torch.from_numpy(a) for a in session.run(None, feeds))

    return run


def inductor_by_hand(work: Workload, calls: list[Sample]) -> Callable[[Sample], Any]:
    """``torch.compile(model, dynamic=True)``: one graph for the varying trace."""
    torch._dynamo.reset()
    compiled = torch.compile(work.model, dynamic=True)
    return lambda sample: sample.run(compiled)


BACKENDS: dict[str, Callable[[], Backend]] = {
    "openvino": OpenVINO,
    "onnxruntime": OnnxRuntime,
    "inductor": Inductor,
}


def by_hand(
    name: str, work: Workload, calls: list[Sample], folder: Path
) -> Callable[[Sample], Any]:
    if name == "openvino":
        return openvino_by_hand(work, calls)
    if name == "onnxruntime":
        return onnxruntime_by_hand(work, calls, folder)
    return inductor_by_hand(work, calls)


def artifact_call(runner: Any, bound: Sample) -> Call:
    """The backend call on tunetree's artifact, inputs converted beforehand (None: no such call)."""
    arrays = [as_numpy(t) for t in runner.inputs.pick(bound.args, bound.kwargs)]
    if hasattr(runner, "request"):  # OpenVINO, inputs by port index as the runner passes them
        request, by_port = runner.request, dict(enumerate(arrays))
        return lambda: request.infer(by_port, share_inputs=True, share_outputs=False)
    if hasattr(runner, "session"):  # ONNX Runtime on the CPU
        session, names = runner.session, runner.output_names
        feeds = {name: arrays[i] for name, i in runner.feeds}
        return lambda: session.run(names, feeds)
    raise TypeError(type(runner).__name__)


class Cycle:
    """Zero-argument callables called in turn; ``cycle`` lets measure use whole passes."""

    def __init__(self, calls: list[Call]) -> None:
        self.calls, self.cycle, self.i = calls, len(calls), 0

    def __call__(self) -> Any:
        call = self.calls[self.i % self.cycle]
        self.i += 1
        return call()


def bound_sample(dispatcher: Dispatcher, sample: Sample) -> tuple[Runner | None, Sample]:
    args, kwargs = dispatcher.binder.bind(sample.args, sample.kwargs)
    return dispatcher.route(GraphKey.of(args, kwargs)), Sample(args, kwargs)


@dataclasses.dataclass
class Row:
    model: str
    backend: str
    calls: str
    ms: dict[str, float]
    spread: dict[str, float]
    fallbacks: int
    note: str = ""

    def ratio(self, a: str, b: str) -> float | None:
        if a in self.ms and b in self.ms:
            return self.ms[a] / self.ms[b]
        return None


def run_pair(
    work: Workload,
    backend: str,
    recorded: list[Sample],
    unseen: list[Sample],
    device: torch.device,
    config: tt.MeasureConfig,
    folder: Path,
) -> list[Row]:
    start = time.perf_counter()
    result = tt.tune(
        work.model,
        recorded,
        depth=0,
        strategy=tt.OneBackendStrategy(BACKENDS[backend]()),
        device=device,
        cache=False,
        verbose=False,
    )
    tune_s = time.perf_counter() - start
    dispatcher = dispatcher_of(result.model)
    if dispatcher is None:
        reason = "; ".join(r.reason or "" for g in result.graphs for r in g.rows if r.reason)
        return [Row(work.name, backend, "-", {}, {}, 0, f"not built: {reason[:120]}")]
    hand = by_hand(backend, work, recorded, folder)
    rows = []
    for calls_name, samples in (("recorded", recorded), ("unseen", unseen)):
        routed = [bound_sample(dispatcher, s) for s in samples]
        tuned = Cycle([lambda s=s: s.run(result.model) for s in samples])
        # Two runs: a block that follows another runtime's block starts with colder caches
        # (and, for ONNX Runtime, beside its spinning threads), so the headline pair alternates
        # by hand and tunetree only, and the split is timed on tunetree's artifact alone.
        before = dispatcher.fallback_calls
        pair = tt.measure(
            {"by hand": Cycle([lambda s=s: hand(s) for s in samples]), "tunetree": tuned},
            device,
            config,
        )
        fallbacks = dispatcher.fallback_calls - before
        split_candidates: dict[str, Call] = {"tunetree": tuned}
        if all(r is not None for r, _ in routed):
            split_candidates["runner"] = Cycle([lambda r=r, b=b: b.run(r) for r, b in routed])
            if backend != "inductor":
                split_candidates["artifact"] = Cycle([artifact_call(r, b) for r, b in routed])
        split = tt.measure(split_candidates, device, config)
        scale = pair["tunetree"].median_s / split["tunetree"].median_s
        ms = {
            "by hand": pair["by hand"].median_s * 1e3,
            "tunetree": pair["tunetree"].median_s * 1e3,
        }
        ms |= {k: t.median_s * scale * 1e3 for k, t in split.items() if k != "tunetree"}
        spread = {k: t.spread for k, t in pair.items()}
        spread |= {k: t.spread for k, t in split.items() if k != "tunetree"}
        rows.append(
            Row(work.name, backend, calls_name, ms, spread, fallbacks, f"tuned in {tune_s:.0f} s")
        )
        print(format_row(rows[-1]), flush=True)
    return rows


COLUMNS = ("by hand", "tunetree", "runner", "artifact")


def format_row(row: Row) -> str:
    cells = [row.model, row.backend, row.calls]
    for column in COLUMNS:
        ms = row.ms.get(column)
        cells.append("-" if ms is None else f"{ms:.3f} ±{100 * row.spread[column] / 2:.1f}%")
    for a, b in (
        ("tunetree", "by hand"),
        ("tunetree", "runner"),
        ("runner", "artifact"),
        ("artifact", "by hand"),
    ):
        ratio = row.ratio(a, b)
        cells.append("-" if ratio is None else f"{ratio:.3f}")
    cells += [str(row.fallbacks), row.note]
    return "| " + " | ".join(cells) + " |"


TABLE_HEAD = (
    "| model | backend | calls | by hand ms | tunetree ms | runner ms | artifact ms "
    "| tunetree / by hand | tunetree / runner (dispatch) | runner / artifact (conversions) "
    "| artifact / by hand (artifact, config) | fallbacks | note |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def unseen_calls(work: Workload, recorded: list[Sample], n: int) -> list[Sample]:
    """``n`` calls inside the recorded ranges whose shapes were not recorded."""
    seen = {tuple(tuple(t.shape) for t in (*s.args, *s.kwargs.values())) for s in recorded}
    batches = [_first(s).shape[0] for s in recorded]
    lengths = [_first(s).shape[1] for s in recorded] if work.seq else [0]
    inside = dataclasses.replace(
        work,
        batch=(min(batches), max(batches)),
        seq=(min(lengths), max(lengths)) if work.seq else None,
    )
    out = []
    for sample in trace(inside, 20 * n, seed=1):
        shape = tuple(tuple(t.shape) for t in (*sample.args, *sample.kwargs.values()))
        if shape not in seen and len(out) < n:
            seen.add(shape)
            out.append(sample)
    return out


def main() -> None:
    p = common.parser(__doc__.splitlines()[0], list(MODELS))
    p.add_argument("--backends", default=None, help="comma-separated (default: per device)")
    args = p.parse_args()
    common.cuda_setup(args.device)
    info = common.header(common.command_line())
    device = torch.device(args.device)
    default = "inductor" if device.type == "cuda" else "openvino,onnxruntime,inductor"
    backends = (args.backends or default).split(",")
    # Long blocks: a block that starts beside the previous runtime's busy threads weighs little.
    long = tt.MeasureConfig(trials=15, block_s=0.2, max_s_per_candidate=6.0)
    config = tt.MeasureConfig.quick() if args.quick else long
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            work = MODELS[name](device, args.quick)
            recorded = subset(trace(work, 40), 6)
            unseen = unseen_calls(work, recorded, 6)
            for backend in backends:
                try:
                    rows += run_pair(work, backend, recorded, unseen, device, config, Path(tmp))
                except Exception as exc:  # one broken pair must not end the run
                    rows.append(Row(work.name, backend, "-", {}, {}, 0, f"failed: {exc!r}"[:160]))
                    print(format_row(rows[-1]), flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}\n")
    print(TABLE_HEAD)
    for row in rows:
        print(format_row(row))
    common.write_json(
        args.out,
        f"runner_overhead_{args.device}.json",
        {"header": info, "rows": [dataclasses.asdict(r) for r in rows]},
    )


if __name__ == "__main__":
    main()
