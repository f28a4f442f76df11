"""What a tuned runner costs beside the same backend used by hand (issue 22).

Run: ``python -m benchmarks.runner_overhead [--device cuda] [--models mlp,bert,cnn]
[--backends openvino,onnxruntime,inductor,device-graph] [--quick] [--out DIR]`` (default
backends: OpenVINO, ONNX Runtime and Inductor on the CPU; Inductor and CUDA graphs on CUDA).

For every model and backend, tunetree tunes the model at depth 0 with only that backend
(``OneBackendStrategy``) on six calls of varying shape; beside it the same backend is set up
by hand as a careful user would (one export over the same ranges, numpy in and out, the
backend's own recommended settings). Four ways of serving the same calls are then measured side
by side in one ``candidates.measure`` run, on the recorded calls and on unseen calls inside
the ranges:

- ``by hand``: the backend set up by hand;
- ``tunetree``: the tuned model, as a user calls it;
- ``runner``: tunetree's runner for each call's graph, called with the already bound
  arguments (no binding, keying or routing);
- ``artifact``: the backend call on tunetree's own artifact (its OpenVINO model, ONNX session,
  captured CUDA graph) with inputs converted beforehand: no tunetree code at all. For a CUDA
  graph that is the by-hand call made on tunetree's capture: copy the inputs into its static
  buffers, replay, clone the outputs into a tuple (none for Inductor).

CUDA graphs by hand (``device-graph``, CUDA only) are what a careful user writes with
``torch.cuda.CUDAGraph``: per input shape, static input buffers cloned from a call, three warm-up
calls on a side stream, then a capture under ``torch.no_grad()``; each call looks its shapes up
in a dict, copies its inputs into that capture's buffers, replays and clones the outputs (the
next replay overwrites them, and a caller keeps its results), returned as a tensor or a tuple
of tensors like the other by-hand paths (no ``ModelOutput`` rebuilt). One graph is captured
per recorded shape at setup; an unseen shape is **captured on its first call**, which happens
in the measurement's untimed warm-up. That is what tunetree's ``DeviceGraph()`` does inside
the tuned range (up to ``max_shapes`` = 16 captures per graph; this benchmark's 12 shapes fit)
and what ``torch.compile(mode="reduce-overhead")`` does; the other choice a user has, eager for
shapes not captured up front, would make the by-hand side the eager model on unseen calls and
say nothing about tunetree's runner. tunetree's side is ``tt.tune`` at depth 0 with
``OneBackendStrategy(DeviceGraph())``, whose runner also clones every output.

``by hand`` and ``tunetree`` are timed in one run of their own with the harder method of
:mod:`benchmarks.common.interleave`: they alternate one pass over the calls at a time, every call
timed, no untimed call before a pass (15 rounds, medians), as calls in a serving process
follow other work. ``candidates.measure``'s blocks, each after an untimed call, had
OpenVINO's runner at 0.97-1.05x of by hand where alternating passes found 1.09-1.12x on
BERT-2L (issue 30; why, in ``benchmarks/README.md``). ``runner`` and ``artifact`` are timed in
a second run beside ``tunetree`` (all on tunetree's artifact, so no block follows another
runtime's) with ``candidates.measure``, and are scaled to the first run by ``tunetree``'s
time.

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
from tunetree.backends import DeviceGraph, Inductor, OnnxRuntime, OpenVINO
from tunetree.backends.base import Backend, Runner
from tunetree.backends.device_graph import DeviceGraphRunner, _shape_key
from tunetree.backends.dtypes import as_numpy
from tunetree.candidates.measure import measure
from tunetree.runtime.wrap import Dispatcher, dispatcher_of
from tunetree.signature.graph import GraphKey, Sample, flatten

from . import common
from .common.interleave import interleaved_passes
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
    """The dynamo ONNX exporter with Dims, a CPU session, numpy in and out."""
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
    # Threads that do not spin, as tunetree's sessions: with ONNX Runtime's default they keep
    # spinning after each call and slow whatever runs next, here the other approach's pass (in
    # a serving process, the user's own work).
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
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
    """``torch.compile(model, dynamic=True)``: one graph for the varying trace.

    No ``torch._dynamo.reset()`` first: it empties every compiled-code cache in the process,
    tunetree's too, and a ranged Inductor runner that finds its graph gone serves every later
    call with the original forward (it never compiles while serving).
    """
    compiled = torch.compile(work.model, dynamic=True)
    return lambda sample: sample.run(compiled)


def _output_tensors(out: Any) -> list[torch.Tensor]:
    """A forward's output tensors in eager's order (a ``ModelOutput``'s fields, a tuple's items)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):  # transformers' ModelOutput
        out = out.to_tuple()
    return [t for t in flatten(out)[0] if isinstance(t, torch.Tensor)]


def _cloned(outs: list[torch.Tensor]) -> Any:
    """The caller's copies of a replay's outputs: one tensor, or a tuple of them."""
    if len(outs) == 1:
        return outs[0].clone()
    return tuple(t.clone() for t in outs)


class CudaGraphsByHand:
    """CUDA graphs as a careful user writes them: one capture per input shape.

    A capture clones the call's tensors into static buffers, warms the model up three times on
    a side stream (cuBLAS handles and lazy initialisation must not happen inside the capture),
    then captures one forward under ``torch.no_grad()``. A call copies its inputs into the
    capture for its shapes (captured now when there is none: see the module docstring), replays
    and clones the outputs.
    """

    def __init__(
        self,
        model: nn.Module,
        calls: list[Sample],
        warmup: int = 3,
        pool: Any = None,
        drop_workspaces: bool = False,
    ) -> None:
        self.model, self.warmup = model, warmup
        self.pool = pool
        """A memory pool every capture shares (``torch.cuda.graph_pool_handle()``), or None."""
        self.drop_workspaces = drop_workspaces
        """Drop cuBLAS's workspaces before and after each capture, as tunetree's runner does."""
        self.graphs: dict[tuple[Any, ...], tuple[Any, list[torch.Tensor], list[torch.Tensor]]] = {}
        for sample in calls:
            self(sample)

    @staticmethod
    def _inputs(sample: Sample) -> list[torch.Tensor]:
        return [*sample.args, *sample.kwargs.values()]

    def _capture(self, sample: Sample) -> tuple[Any, list[torch.Tensor], list[torch.Tensor]]:
        args = [a.clone() for a in sample.args]
        kwargs = {k: v.clone() for k, v in sample.kwargs.items()}
        if self.drop_workspaces:
            torch._C._cuda_clearCublasWorkspaces()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad():
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.model(*args, **kwargs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.model(*args, **kwargs)
        if self.drop_workspaces:
            torch._C._cuda_clearCublasWorkspaces()
        return graph, [*args, *kwargs.values()], _output_tensors(out)

    def __call__(self, sample: Sample) -> Any:
        inputs = self._inputs(sample)
        shapes = tuple(t.shape for t in inputs)
        entry = self.graphs.get(shapes)
        if entry is None:
            entry = self.graphs[shapes] = self._capture(sample)
        graph, static, outs = entry
        for buffer, value in zip(static, inputs, strict=True):
            buffer.copy_(value)
        graph.replay()
        return _cloned(outs)


BACKENDS: dict[str, Callable[[], Backend]] = {
    "openvino": OpenVINO,
    "onnxruntime": OnnxRuntime,
    "inductor": Inductor,
    "device-graph": DeviceGraph,
}


def by_hand(
    name: str, work: Workload, calls: list[Sample], folder: Path
) -> Callable[[Sample], Any]:
    if name == "openvino":
        return openvino_by_hand(work, calls)
    if name == "onnxruntime":
        return onnxruntime_by_hand(work, calls, folder)
    if name == "device-graph":
        return CudaGraphsByHand(work.model, calls)
    return inductor_by_hand(work, calls)


def device_graph_call(runner: Any, bound: Sample) -> Call:
    """Copy in, replay, clone out on tunetree's own capture for this call (no tunetree code)."""
    capture = runner
    if not isinstance(runner, DeviceGraphRunner):  # a ranged graph's ShapeSetRunner
        capture = runner.captures[_shape_key(tuple(bound.args), bound.kwargs)]
    leaves, _ = flatten((bound.args, dict(sorted(bound.kwargs.items()))))
    pairs = [(static, leaves[i]) for i, static in capture.tensor_slots]
    return replay_call(capture.graph, pairs, _output_tensors(capture.static_out))


def replay_call(graph: Any, pairs: list[tuple[torch.Tensor, Any]], outs: list[Any]) -> Call:
    """Copy each value into its static buffer, replay, clone the outputs: nothing else."""

    def call() -> Any:
        for static, value in pairs:
            static.copy_(value)
        graph.replay()
        return _cloned(outs)

    return call


def artifact_call(runner: Any, bound: Sample) -> Call | None:
    """The backend call on tunetree's artifact, inputs converted beforehand (None: no such call)."""
    if hasattr(runner, "captures") or isinstance(runner, DeviceGraphRunner):
        return device_graph_call(runner, bound)
    if not hasattr(runner, "inputs"):  # Inductor: the compiled function is the runner's call
        return None
    arrays = [as_numpy(t) for t in runner.inputs.pick(bound.args, bound.kwargs)]
    if hasattr(runner, "request"):  # OpenVINO, inputs by port index as the runner passes them
        request, by_port = runner.request, dict(enumerate(arrays))
        return lambda: request.infer(by_port, share_inputs=True, share_outputs=False)
    if hasattr(runner, "session"):  # ONNX Runtime on the CPU
        session, names = runner.session, runner.output_names
        feeds = {name: arrays[i] for name, i in runner.feeds}
        return lambda: session.run(names, feeds)
    return None


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


def runner_eager_calls(runners: list[Any]) -> int:
    """Calls the runners served with the original forward so far (their own count)."""
    return sum(getattr(r, "eager_calls", 0) for r in runners)


def run_pair(
    work: Workload,
    backend: str,
    recorded: list[Sample],
    unseen: list[Sample],
    device: torch.device,
    config: tt.MeasureConfig,
    folder: Path,
    rounds: int = 15,
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
        # Every shape once on both sides before timing, as measure runs them (without
        # autograd): first-call work (a CUDA graph captured for an unseen shape, a compile)
        # must not land in a warm-up estimate or a timed block.
        with torch.no_grad():
            for s in samples:
                hand(s)
                s.run(result.model)
        # Two runs: a block that follows another runtime's block starts with colder caches
        # (and, for ONNX Runtime, beside its spinning threads), so the headline pair alternates
        # by hand and tunetree only, and the split is timed on tunetree's artifact alone.
        # Calls a runner serves with the original forward itself (an Inductor graph's guards
        # refuse the shape, a ShapeSetRunner is full) are not in the dispatcher's fallbacks.
        runners = list({id(r): r for r, _ in routed if r is not None}.values())
        before, eager_before = dispatcher.fallback_calls, runner_eager_calls(runners)
        # The headline pair alternates one pass over the calls at a time, every call timed
        # and no untimed call first (the harder method: see the module docstring).
        pair = interleaved_passes(
            {"by hand": hand, "tunetree": lambda s: s.run(result.model)},
            samples,
            device,
            rounds,
        )
        fallbacks = dispatcher.fallback_calls - before
        runner_eager = runner_eager_calls(runners) - eager_before
        split_candidates: dict[str, Call] = {"tunetree": tuned}
        if all(r is not None for r, _ in routed):
            split_candidates["runner"] = Cycle([lambda r=r, b=b: b.run(r) for r, b in routed])
            artifacts = [artifact_call(r, b) for r, b in routed]
            if all(a is not None for a in artifacts):
                split_candidates["artifact"] = Cycle(artifacts)  # type: ignore[arg-type]
        split = measure(split_candidates, device, config)
        scale = pair["tunetree"].median_s / split["tunetree"].median_s
        ms = {
            "by hand": pair["by hand"].median_s * 1e3,
            "tunetree": pair["tunetree"].median_s * 1e3,
        }
        ms |= {k: t.median_s * scale * 1e3 for k, t in split.items() if k != "tunetree"}
        spread = {k: (t.q3_s - t.q1_s) / t.median_s for k, t in pair.items()}
        spread |= {k: t.spread for k, t in split.items() if k != "tunetree"}
        note = f"tuned in {tune_s:.0f} s"
        note += f"; runner eager calls {runner_eager}"
        captures = sum(len(getattr(r, "captures", ())) for r in runners)
        if backend == "device-graph":
            hand_graphs = len(getattr(hand, "graphs", {}))
            note += f"; captures {captures}, by hand {hand_graphs}"
        rows.append(Row(work.name, backend, calls_name, ms, spread, fallbacks, note))
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
    cuda = device.type == "cuda"
    default = "inductor,device-graph" if cuda else "openvino,onnxruntime,inductor"
    backends = (args.backends or default).split(",")
    # Long blocks on the CPU: a block that starts beside the previous runtime's busy threads
    # weighs little. On the GPU no thread pools spin between blocks: shorter blocks will do.
    long = (
        tt.MeasureConfig(trials=15, block_s=0.1, max_s_per_candidate=3.0)
        if cuda
        else tt.MeasureConfig(trials=15, block_s=0.2, max_s_per_candidate=6.0)
    )
    config = tt.MeasureConfig.quick() if args.quick else long
    rounds = 3 if args.quick else 15
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            work = MODELS[name](device, args.quick)
            recorded = subset(trace(work, 40), 6)
            unseen = unseen_calls(work, recorded, 6)
            for backend in backends:
                try:
                    rows += run_pair(
                        work, backend, recorded, unseen, device, config, Path(tmp), rounds
                    )
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
