"""Inspect a model: which modules run, at which depth, how often, for how long, with which inputs.

Depth counts executed-module hops below the root: the model is depth 0, a module it
calls is depth 1, and so on. Containers that are never called themselves
(``nn.ModuleList``, ``nn.ModuleDict``) are transparent. Nothing is wrapped here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .._util.table import format_table
from ..errors import InvalidInputError
from ..hf import StaticLayers, batch_of
from .binding import Binder
from .envelope import declared_dims, probe_calls
from .graph import Dim, Graph, GraphKey, Sample, as_samples, detach_clone, map_tensors, to_device
from .modules import CallFn, module_paths, resolve_device, run_model, synchronize
from .recording import Ledger, RecordingSummary, default_budget_bytes, tensor_bytes
from .shapes import (
    AxisRef,
    DynamicShapes,
    RootDim,
    dim_sizes,
    group_graphs,
    root_dims,
)
from .state import preserved_state

log = logging.getLogger(__name__)

FAST_PATH_OPS: dict[str, type[nn.Module]] = {
    "_transformer_encoder_layer_fwd": nn.TransformerEncoderLayer,
    "_native_multi_head_attention": nn.MultiheadAttention,
}
"""PyTorch's fused inference fast paths: the op, and the module type that takes it.

Without autograd, in eval mode, these modules run one fused kernel instead of their
submodules; eager is then already close to what a backend makes of the same math (on a
small CPU no depth of the demo encoder may beat it). A forward hook on such a
module turns its fast path off, so inspection records none inside it."""


@dataclass
class ModuleRecord:
    """One executed module."""

    path: str
    type_name: str
    depth: int
    parent: str | None
    children: list[str] = field(default_factory=list)
    calls: int = 0
    total_s: float = 0.0
    self_s: float = 0.0
    graphs: dict[GraphKey, Graph] = field(default_factory=dict)

    @property
    def is_leaf(self) -> bool:
        """True when this module calls no other module."""
        return not self.children

    @property
    def takes_no_tensor(self) -> bool:
        """True when every recorded call passed no tensor at all (only sizes, flags, ints).

        Such a call makes its tensors from constants (Marian's positional embedding takes the
        input's shape as a tuple): each value is a graph of its own, so a runner built for the
        recorded ones never serves another length, and there is no data to speed up.
        """
        return bool(self.graphs) and all(not key.tensor_specs() for key in self.graphs)


@dataclass(frozen=True)
class DepthSummary:
    """What a cut at one depth wraps."""

    depth: int
    modules: int
    graphs: int
    time_share: float


@dataclass
class ModelInfo:
    """The result of :func:`inspect`: executed modules in execution order, and eager outputs.

    ``print()`` it for the module tree and how many modules each cut depth wraps.

    Attributes:
        modules: Each executed module's record by path (``""`` is the root).
        samples: The recorded calls of the root.
        outputs: Eager's outputs of those calls.
        total_s: Eager's time for all calls.
        device: Where the model ran.
        root_called: False when the object itself is never called through ``__call__`` (a
            pipeline or a ``generate`` loop): depth 0 is then the outermost modules it calls.
    """

    modules: dict[str, ModuleRecord]
    samples: list[Sample]
    outputs: list[Any]
    total_s: float
    device: torch.device
    root_called: bool = True
    """False when the model is a pipeline object or a module whose forward never ran
    through ``__call__`` (a ``generate`` loop calling ``self.forward``): depth 0 is then the
    outermost modules it called, not the object itself."""
    model_type: str = ""
    root_is_module: bool = True
    fused: dict[str, str] = field(default_factory=dict)
    """Modules that run as one fused fast-path op (:data:`FAST_PATH_OPS`), path to op name.

    Their submodules never run in inference, so they are not recorded: each is a leaf."""
    recording: RecordingSummary | None = None
    """What the recording copied and what it kept as signatures only (:mod:`.recording`)."""

    @property
    def max_depth(self) -> int:
        """The deepest depth that has modules."""
        return max((m.depth for m in self.modules.values()), default=0)

    def cut(self, depth: int) -> list[str]:
        """Paths a tune at ``depth`` wraps.

        Every executed module at ``depth`` plus every executed leaf shallower than it, so the cut
        covers the whole forward; a module whose calls pass no tensor is left out (it runs as it
        is, inside its parent: see :attr:`ModuleRecord.takes_no_tensor`).
        """
        if depth < 0:
            raise InvalidInputError(f"depth must be >= 0, got {depth}")
        return [
            m.path
            for m in self.modules.values()
            if (m.depth == depth or (m.depth < depth and m.is_leaf)) and not m.takes_no_tensor
        ]

    def summary(self, depth: int) -> DepthSummary:
        """What a cut at ``depth`` wraps: modules, graphs and share of the forward time."""
        paths = self.cut(depth)
        graphs = sum(len(self.modules[p].graphs) for p in paths)
        share = sum(self.modules[p].total_s for p in paths) / self.total_s if self.total_s else 0
        return DepthSummary(depth, len(paths), graphs, share)

    def summaries(self) -> list[DepthSummary]:
        """One summary per depth, from 0 to the deepest."""
        return [self.summary(d) for d in range(self.max_depth + 1)]

    def depth0_text(self) -> str:
        """What depth 0 is for this model, and why."""
        if self.root_called:
            return f"depth 0 is the model itself ({self.model_type})"
        tops = [m.path for m in self.modules.values() if m.depth == 0]
        shown = _first_few(tops)
        why = (
            "its forward never ran through __call__ (e.g. a generate loop calling self.forward)"
            if self.root_is_module
            else "it is not a module"
        )
        return (
            f"depth 0 is not the {self.model_type} object itself: {why}; depth 0 is the "
            f"outermost modules it called ({shown})"
        )

    def coverage_note(self, threshold: float = 0.5) -> str:
        """A sentence when less than ``threshold`` of eager time is inside tunable modules."""
        share = self.summary(0).time_share if self.modules else 0.0
        if share >= threshold:
            return ""
        if self.root_called:
            cause = "the rest runs outside any module"
        elif self.root_is_module:
            cause = "the root's forward is never called through __call__"
        else:
            cause = f"the rest runs in the {self.model_type} object's own code, outside modules"

        return f"only {100 * share:.1f}% of eager time is inside tunable modules: {cause}"

    def fast_path_note(self) -> str:
        """A sentence when modules run PyTorch's fused fast paths (empty otherwise)."""
        if not self.fused:
            return ""
        ops = sorted(set(self.fused.values()))
        kinds = ", ".join(f"{FAST_PATH_OPS[op].__name__} (aten.{op})" for op in ops)
        paths = list(self.fused)
        shown = _first_few([p or "<model>" for p in paths])
        return (
            f"{len(paths)} modules run PyTorch's fused inference fast path, {kinds}: {shown}. "
            "Eager is already one fused kernel per module there, so tuning may gain little "
            "or nothing and leave the model untuned; their submodules never run and are not tuned"
        )

    def __str__(self) -> str:
        total = self.total_s or 1.0
        tree = format_table(
            ["module", "type", "depth", "calls", "graphs", "total %", "self %"],
            [
                [
                    ("  " * m.depth) + (m.path or "<model>"),
                    m.type_name,
                    m.depth,
                    m.calls,
                    len(m.graphs),
                    f"{100 * m.total_s / total:.1f}",
                    f"{100 * m.self_s / total:.1f}",
                ]
                for m in self.modules.values()
            ],
            title=f"Executed modules ({len(self.modules)}, {len(self.samples)} samples)",
        )
        cuts = format_table(
            ["depth", "modules wrapped", "graphs", "time covered %"],
            [[s.depth, s.modules, s.graphs, f"{100 * s.time_share:.1f}"] for s in self.summaries()],
            title="Cuts",
        )
        notes = [self.depth0_text()] + [
            n for n in [self.coverage_note(), self.fast_path_note()] if n
        ]
        return tree + "\n\n" + cuts + self._graphs_table() + "\n" + "\n".join(notes)

    def _graphs_table(self, max_depth: int = 1, limit: int = 20) -> str:
        """The graphs of the shallow modules with their ranges (``i64[batch 1..16, ...]``)."""
        rows = [
            [m.path or "<model>", str(g.key), len(g.samples)]
            for m in self.modules.values()
            if m.depth <= max_depth
            for g in m.graphs.values()
        ]
        if not rows:
            return ""
        more = f" (first {limit} of {len(rows)})" if len(rows) > limit else ""
        return "\n\n" + format_table(
            ["module", "graph (a range: one runner serves every size in it)", "samples"],
            rows[:limit],
            title=f"Graphs at depth <= {max_depth}{more}",
        )


def _shape_only(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")


class _Recorder:
    """Forward hooks that build :class:`ModuleRecord` s during eager calls."""

    def __init__(
        self,
        device: torch.device,
        max_samples_per_graph: int,
        max_bytes: int,
        max_depth: int | None = None,
    ) -> None:
        self.device = device
        self.max_depth = max_depth
        """Calls deeper than this are not recorded (their time stays in their callers')."""
        self.ledger = Ledger(max_samples_per_graph, max_bytes)
        self.records: dict[str, ModuleRecord] = {}
        self.stack: list[tuple[str, float, float]] = []  # path, start, time in children
        self.in_step: list[bool] = []
        """Per open call: whether it, or a call around it, takes a cache (a generation step)."""
        self.pending: list[tuple[GraphKey | None, Sample | None]] = []
        self.binders: dict[str, Binder] = {}
        self.calls: dict[str, list[tuple[Sample, Any]]] = {}
        self.origins: dict[str, list[int]] = {}
        """Per module, the index of the root call each of its recorded calls came from."""
        self.root_items: list[int] = []
        """The dataset item each root call came from (indexed as ``origins``)."""
        self.root_calls = 0
        self.probe_calls: dict[str, list[tuple[Sample, Any]]] = {}
        self.probing = False
        """True while the root runs probe calls: they are kept apart and not counted."""
        self.static_layers = StaticLayers()
        """Static cache layers' sizes, to initialise a fresh cache before a call (as a tuned
        model's dispatcher does), so that a prefill is keyed like every other step."""
        self.fresh: list[tuple[Sample, int | None]] = []
        """Copies of this root call taken while its cache had layers of unknown sizes, with
        the call's batch: initialised once the root call has run (and the sizes are known)."""

    def pre(self, path: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        ready = self.static_layers.initialise(args, kwargs)
        if self.probing:  # only the shapes matter: meta tensors hold no memory
            bound = self._bind(path, module, args, kwargs)
            self.pending.append(
                (None, Sample(*map_tensors(_shape_only, (bound.args, bound.kwargs))))
            )
            self.stack.append((path, 0.0, 0.0))
            return
        if self.max_depth is not None and len(self.stack) > self.max_depth:
            self.stack.append((path, -1.0, 0.0))  # not recorded
            return
        parent = self.stack[-1][0] if self.stack else None
        if parent is None:
            self.root_calls += 1
            self.root_items.append(self.ledger.item)
        record = self.records.get(path)
        if record is None:
            record = ModuleRecord(path, type(module).__name__, len(self.stack), parent)
            self.records[path] = record
            if parent is not None and path not in self.records[parent].children:
                self.records[parent].children.append(path)
        record.depth = min(record.depth, len(self.stack))
        sample = self._bind(path, module, args, kwargs)
        key = sample.key
        in_step = (bool(self.in_step) and self.in_step[-1]) or self.ledger.takes_cache(sample)
        self.in_step.append(in_step)
        copy = None
        if self.ledger.admit(path, sample, key, in_step, len(self.stack)):
            copy = detach_clone(sample)
            if not ready:
                self.fresh.append((copy, batch_of(args, kwargs)))
            self.ledger.copied += 1
            self.ledger.copied_now(tensor_bytes((copy.args, copy.kwargs)))
        self.pending.append((key, copy))
        synchronize(self.device)
        self.stack.append((path, time.perf_counter(), 0.0))

    def _bind(self, path: str, module: nn.Module, args: tuple, kwargs: dict) -> Sample:
        """The call in its canonical form (:mod:`tunetree.signature.binding`)."""
        binder = self.binders.get(path)
        if binder is None:
            binder = self.binders[path] = Binder.of_module(module)
        bound_args, bound_kwargs = binder.bind(tuple(args), dict(kwargs))
        return Sample(tuple(bound_args), dict(bound_kwargs))

    def post(self, path: str, output: Any) -> None:
        if self.probing:
            self.stack.pop()
            _, sample = self.pending.pop()
            if sample is not None and path in self.records:
                self.probe_calls.setdefault(path, []).append((sample, None))
            return
        if self.stack and self.stack[-1][1] < 0:  # deeper than max_depth: not recorded
            self.stack.pop()
            return
        synchronize(self.device)
        end = time.perf_counter()
        top, start, in_children = self.stack.pop()
        assert top == path, f"module calls did not nest: {top} vs {path}"
        self.in_step.pop()
        elapsed = end - start
        if self.stack:
            parent, pstart, pchildren = self.stack[-1]
            self.stack[-1] = (parent, pstart, pchildren + elapsed)
        record = self.records[path]
        record.calls += 1
        record.total_s += elapsed
        record.self_s += elapsed - in_children
        key, sample = self.pending.pop()
        if not self.stack and self.fresh:
            self._initialise_fresh(output)
            if sample is not None:
                key = sample.key
        if key is not None:
            self.ledger.timed(path, key, elapsed)
        if sample is not None:
            copied = detach_clone(output)
            self.ledger.copied_now(tensor_bytes(copied))
            self.calls.setdefault(path, []).append((sample, copied))
            self.origins.setdefault(path, []).append(self.root_calls - 1)

    def _initialise_fresh(self, output: Any) -> None:
        """Initialise the fresh layers of this root call's copies.

        As a later call's are before it runs; the sizes come from the cache the call returned.
        """
        self.static_layers.learn(output)
        for copy, batch in self.fresh:
            self.static_layers.initialise(copy.args, copy.kwargs, batch)
        self.fresh.clear()

    def group(self, dynamic: bool, declared: dict[AxisRef, Dim] | None) -> None:
        """Group every module's recorded calls into graphs.

        Ranges come from the root first, whose dimension names the other modules borrow; an
        axis of another module that follows a root dimension call for call serves its whole
        range (:func:`~.shapes.ranged_key`).
        """
        known: list[tuple[frozenset[int], str]] = []
        followed: list[RootDim] = []
        roots = [r.path for r in self.records.values() if r.parent is None]
        stats: dict[str, dict[GraphKey, tuple[int, float]]] = {}
        for (path, key), counted in self.ledger.stats.items():
            stats.setdefault(path, {})[key] = (counted.calls, counted.seconds)
        for path in roots + [p for p in self.records if p not in roots]:
            calls, origins = self.calls.get(path, []), self.origins.get(path, [])
            graphs = group_graphs(
                calls,
                dynamic=dynamic,
                declared=declared if path == "" else None,
                known=known,
                probes=self.probe_calls.get(path, []),
                followed=followed if path not in roots else (),
                origins=origins,
                described=self.ledger.described.get(path, {}),
                stats=stats.get(path),
            )
            self.records[path].graphs = graphs
            if path in roots:
                known.extend(k for g in graphs.values() for k in dim_sizes(g))
                followed.extend(_root_dims(graphs, calls, origins))

    @contextmanager
    def hooks(self, model: Any, inside: set[str] | None = None) -> Iterator[None]:
        """Recording hooks on every module, but none below the paths in ``inside``."""
        handles = []
        seen: set[int] = set()
        for path, module in module_paths(model):
            if id(module) in seen or any(_inside(path, outer) for outer in inside or ()):
                continue
            seen.add(id(module))
            handles.append(
                module.register_forward_pre_hook(
                    lambda m, a, k, p=path: self.pre(p, m, a, k), with_kwargs=True
                )
            )
            # The pre-hook is registered last, so it runs after the user's pre-hooks and sees
            # what forward sees; the post-hook is prepended, so it records forward's own
            # output before the user's hooks transform it (a tuned module keeps running
            # those hooks around its runner).
            handles.append(
                module.register_forward_hook(
                    lambda m, a, k, o, p=path: self.post(p, o), with_kwargs=True, prepend=True
                )
            )
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def inspect(
    model: Any,
    dataset: Iterable[Any],
    *,
    call: CallFn | None = None,
    device: torch.device | str | None = None,
    max_samples_per_graph: int = 4,
    dynamic_shapes: DynamicShapes = None,
    max_record_bytes: int | None = None,
    max_depth: int | None = None,
    warm_up: bool = True,
) -> ModelInfo:
    """Run ``model`` once per dataset item with forward hooks and record every executed module.

    ``print()`` the result for the module tree and, per depth, how many modules a cut wraps,
    what depth 0 is for this model and how much of the time no module covers. Recording never
    changes the model: buffers and the RNG state are put back afterwards, and a module's
    recorded output is its forward's own, before the user's forward hooks. Copies of calls are
    rationed (:mod:`tunetree.signature.recording`): a generation step is copied a few times per
    ``generate``, never once per token; a call not copied still counts, and its sizes still
    widen its graph's ranges.

    Args:
        model: An ``nn.Module``, or a plain object whose attributes hold modules (a pipeline),
            run by ``call``.
        dataset: What the model is called with, one item per call: a tensor, a tuple or list of
            positional arguments, or a dict of keyword arguments.
        call: ``call(model, *args, **kwargs)`` runs one item (default: ``model(*args, **kwargs)``).
        device: Where to run (default: the model's).
        max_samples_per_graph: Calls kept per graph for checking candidates.
        dynamic_shapes: None makes axes whose size varies across the calls dynamic (one graph
            serves a range of sizes); False keys every exact shape apart; a torch.export-style
            nest of :class:`tunetree.Dim` declares the root's dimensions (the root is then also
            run, unrecorded, at the ranges' ends so every module sees them); with ``call`` it
            declares the call's own inputs (a ``generate`` prompt's), and ``call`` is run at
            the envelope's corners.
        max_record_bytes: The most all copies of calls may take (default: a quarter of the
            device's free memory).
        max_depth: Record modules down to this depth only (a tune of shallower cuts needs no
            deeper one).
        warm_up: Run the first item once, untimed, before recording (one-time costs stay out
            of the modules' times). False skips that call where it has nothing else to find
            (no module of a fused fast path's type): a caller that uses no time share.

    Returns:
        A :class:`ModelInfo`: every executed module with its depth, calls and time share.

    Raises:
        InvalidInputError: The dataset is empty, or no module ran.

    Example:
        >>> import torch, tunetree as tt
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        >>> info = tt.inspect(model, [torch.randn(2, 8)])
        >>> sorted(info.modules)
        ['', '0', '1']
    """
    samples = as_samples(dataset)
    dev = resolve_device(model, device)
    samples = [s.to(dev) for s in samples]
    budget = (
        default_budget_bytes(dev, _model_bytes(model))
        if max_record_bytes is None
        else max_record_bytes
    )
    recorder = _Recorder(dev, max_samples_per_graph, budget, max_depth)
    with torch.no_grad(), preserved_state(model):
        fused: dict[str, str] = {}
        if warm_up or _may_run_fast_path(model):  # untimed; a cache it grows is a copy
            fused = _first_call(model, samples[0].own(), call)
        outputs = []
        with recorder.hooks(model, inside=set(fused)):
            start = time.perf_counter()
            for item, sample in enumerate(samples):
                recorder.ledger.item = item
                outputs.append(detach_clone(run_model(model, sample, call)))
            synchronize(dev)
            total = time.perf_counter() - start
            if not recorder.records:
                raise InvalidInputError("no module ran: check the model and the call function")
            root_calls = [sample for sample, _ in recorder.calls.get("", [])]
            names = recorder.binders[""].names if "" in recorder.binders else ()
            declared = declared_dims(model, dynamic_shapes, samples, call, root_calls, names)
            if declared:
                recorder.probing = True  # recorded apart, as probes
                try:
                    items = [recorder.root_items[o] for o in recorder.origins.get("", [])]
                    for probe in probe_calls(declared, samples, call, root_calls, items):
                        run_model(model, probe, call)
                finally:
                    recorder.probing = False
    # With call=, the declared axes are the call's inputs (a prompt's), not the root's: the
    # probes' calls widen every module's ranges, which are inferred from the sizes seen.
    recorder.group(dynamic_shapes is not False, declared if call is None else {})
    ledger = recorder.ledger
    summary = RecordingSummary(
        ledger.copied,
        ledger.copied_bytes,
        sum(len(keys) for keys in ledger.described.values()),
        ledger.over_budget,
        budget,
    )
    return ModelInfo(
        recorder.records,
        samples,
        [to_device(o, dev) for o in outputs],
        total,
        dev,
        root_called="" in recorder.records,
        model_type=type(model).__name__,
        root_is_module=isinstance(model, nn.Module),
        fused=fused,
        recording=summary,
    )


class _FastPathOps(TorchDispatchMode):
    """Collects the parameters passed to fused fast-path ops (:data:`FAST_PATH_OPS`)."""

    def __init__(self) -> None:
        super().__init__()
        self.parameters: dict[int, str] = {}
        """id of each parameter a fast-path op read, to that op's name."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Never run under torch.compile: keeps torch from importing Dynamo (seconds, most of a
        # warm start's) to wrap __torch_dispatch__ on its first call.
        return False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        name = func.overloadpacket.__name__
        if name in FAST_PATH_OPS:
            for value in args:
                if isinstance(value, nn.Parameter):
                    self.parameters[id(value)] = name
        return func(*args, **(kwargs or {}))

    def modules(self, model: Any) -> dict[str, str]:
        """The modules whose fast path ran, path to op.

        Each module of the op's type that owns a parameter the op read; the outermost where
        they nest.
        """
        found: dict[str, str] = {}
        for path, module in module_paths(model):
            for op, kind in FAST_PATH_OPS.items():
                if isinstance(module, kind) and any(
                    self.parameters.get(id(p)) == op for p in module.parameters()
                ):
                    found[path] = op
        return {p: op for p, op in found.items() if not any(_inside(p, q) for q in found)}


def _model_bytes(model: Any) -> int:
    """Bytes of the model's parameters and buffers (each counted once)."""
    seen: set[int] = set()
    total = 0
    for _, module in module_paths(model):
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
    return total


def _first_few(paths: list[str], limit: int = 4) -> str:
    """The first ``limit`` paths, comma-separated, with ``...`` when there are more."""
    return ", ".join(paths[:limit]) + (", ..." if len(paths) > limit else "")


def _inside(path: str, outer: str) -> bool:
    """Whether module ``path`` is a strict descendant of module ``outer``."""
    return path != outer and (outer == "" or path.startswith(outer + "."))


def _may_run_fast_path(model: Any) -> bool:
    """Whether ``model`` holds a module of a fused fast path's type (:data:`FAST_PATH_OPS`)."""
    kinds = tuple(FAST_PATH_OPS.values())
    return any(isinstance(m, kinds) for _, m in module_paths(model))


def _first_call(model: Any, sample: Sample, call: CallFn | None) -> dict[str, str]:
    """Run the untimed first call; return the modules that ran a fused fast path.

    A model that cannot run under a dispatch mode (some tensor subclasses) is run again
    without it, and no fast path is known.
    """
    counter = _FastPathOps()
    try:
        with counter:
            run_model(model, sample, call)
    except Exception as exc:
        log.debug("fast-path detection failed (%r); first call run again without it", exc)
        run_model(model, sample, call)
        return {}
    return counter.modules(model) if counter.parameters else {}


def _root_dims(
    graphs: dict[GraphKey, Graph], calls: list[tuple[Sample, Any]], origins: list[int]
) -> list[RootDim]:
    """The root's dimensions, each with its size per root call (see :func:`~.shapes.root_dims`)."""
    origin_of = {id(sample): origin for (sample, _), origin in zip(calls, origins, strict=True)}
    found: list[RootDim] = []
    for graph in graphs.values():
        if all(id(s) in origin_of for s in graph.samples):
            found.extend(root_dims(graph, [origin_of[id(s)] for s in graph.samples]))
    return found
