"""Device graph capture: record one call's kernel launches once, then replay them.

On a GPU at small batch most of a forward's time is the CPU launching kernels, not
the kernels themselves. A CUDA graph (XPU graph on Intel GPUs) records the launches
of one call and replays them with a single launch, so results are the same kernels
on the same data: only the launch overhead goes. The price is that everything is
static: the input shapes, every non-tensor argument, and the memory the inputs and
outputs live in. The runner therefore copies each call's inputs into static buffers
made when it captured, replays, and (by default) clones the outputs, because the next
replay writes into the same output memory.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree
from torch import nn

from ..errors import BackendError, InvalidInputError
from ..signature.binding import original_forward
from ..signature.graph import (
    Graph,
    GraphKey,
    Sample,
    flatten,
    map_tensors,
)
from ..signature.stateful import (
    cache_objects,
    capacity_of,
    is_cache_object,
    nested_cache_objects,
)
from .base import Backend, Runner
from .direct_replay import DirectReplay, serial_lock, serialised
from .graph_api import graph_api
from .graph_capture import (
    CONSTANT_TYPES,
    StaticInputs,
    capture,
    copy_into,
    pick,
    static_objects,
)
from .inductor import compile_unavailable_reason, fresh_entry
from .placeholders import sample_from_key
from .ranges import check_placeholders

_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""torch.compile modes that capture CUDA graphs themselves; nesting them in ours fails."""


class DeviceGraphRunner(Runner):
    """Replays a graph captured from one call.

    Each call copies its tensors into the static input buffers, replays, and returns the
    static outputs, cloned unless the backend says ``clone_outputs=False`` (then every
    replay overwrites the tensors the previous call returned). An output that is an input
    updated in place (a static cache's key/value tensors, which eager returns inside the
    very cache object it was given) is handed back uncloned: it is the cache's state, as in
    eager, and a caller that passes it back in (``generate`` does) is served without a copy.
    Non-tensor arguments are baked in at capture. Parameters are read from their memory at
    replay, so in-place updates of the weights are seen; replacing a parameter object is not.
    ``pool`` shares the capture's working memory with other captures (see
    :class:`ShapeSetRunner`); one runner's replays, like any one capture's, must not run on
    several streams at once.
    """

    releasable = False  # see Runner.releasable
    serial: Any  # the lock its calls hold (direct_replay.serial_lock); a shape set's own

    def __init__(
        self,
        backend: DeviceGraph,
        module: nn.Module,
        sample: Sample,
        device: torch.device,
        warmup: int = 3,
        compiled: Callable[..., Any] | None = None,
        pool: Any = None,
    ) -> None:
        super().__init__(backend)
        self.clone_outputs = backend.clone_outputs
        eager: Callable[..., Any] = original_forward(module)
        forward = eager
        if backend.compile:
            forward = compiled or torch.compile(
                fresh_entry(eager), mode=backend.compile_mode, dynamic=False
            )
        inputs = StaticInputs.of(sample)
        self.spec, self.static_leaves = inputs.spec, inputs.leaves
        self.tensor_slots, self.paths = inputs.tensor_slots, inputs.paths
        self.n_args, self.kw_names = len(inputs.args), frozenset(inputs.kwargs)
        self.top_slots = inputs.top_slots
        """Where a top-level call passes each tensor (None: arguments are nested)."""
        self.objects = static_objects(inputs)
        captured = capture(
            graph_api(device),
            device,
            inputs,
            self.objects,
            (eager if backend.compile else forward, forward),
            warmup,
            pool,
        )
        self.graph, self.static_out = captured.graph, captured.output
        self.advances = captured.advances
        """Positions the step advances (``(object index, attribute, by how much)``): a replay
        runs no Python, so the runner moves them as eager's code did during the capture."""
        self.fallback = original_forward(module)
        self.eager_calls = 0
        """Calls served by the original forward: their positions would cross the capacity."""
        self._own(inputs.top)

    def _own(self, top: list[tuple[int | str, Any]]) -> None:
        """Decide, once, which outputs are the inputs' state and which the caller gets copies of.

        Outputs that are inputs updated in place (a static cache's key/value tensors, which
        eager returns in the very cache object it was given) are handed back as they are, as
        eager does; a caller that passes them back in is then served without a copy.
        """
        self.in_place = {id(static) for _, static in self.tensor_slots}
        self.kept_objects = {
            id(obj)
            for obj in cache_objects(self.static_out)
            if all(id(t) in self.in_place for t in flatten(obj)[0] if isinstance(t, torch.Tensor))
        }
        """Cache objects of the output whose every tensor is updated input state: returned as
        they are (no rebuild per call)."""
        out = self.static_out
        self.clone_only = (
            self.clone_outputs and isinstance(out, torch.Tensor) and id(out) not in self.in_place
        )
        """The output is one tensor the caller gets a clone of (decided once, not per call)."""
        owned = [(where, v) for where, v in top if id(v) in self.kept_objects]
        self.owned_at: tuple[int | str, Any] | None = owned[0] if len(owned) == 1 else None
        """Where the call passes the cache object this runner returns (when it is one object at
        the top level), and that object: a call passing it back is served without looking
        inside it (its tensors are this runner's static inputs already)."""
        inside = (
            {id(t) for t in flatten(self.owned_at[1])[0] if isinstance(t, torch.Tensor)}
            if self.owned_at is not None
            else set()
        )
        self.outside = [
            (static, path)
            for (_, static), path in zip(self.tensor_slots, self.paths, strict=True)
            if id(static) not in inside
        ]
        self._owned_ids = frozenset({id(self.owned_at[1])} if self.owned_at is not None else ())

    def owned_ids(self) -> frozenset[int]:
        """The id of the cache object this runner returns, when a caller may pass it back."""
        return self._owned_ids

    def passes_back(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether the call passes back the cache object this runner returned."""
        if self.owned_at is None:
            return False
        where, obj = self.owned_at
        if isinstance(where, int):
            return where < len(args) and args[where] is obj
        return kwargs.get(where) is obj

    def fits_passed_back(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """For a call passing back the owned cache: whether its other tensors fit the capture."""
        root = (args, kwargs)
        try:
            for static, path in self.outside:
                value = pick(root, path)
                if (
                    not isinstance(value, torch.Tensor)
                    or value.shape != static.shape
                    or value.dtype != static.dtype
                ):
                    return False
        except BackendError:
            return False
        return True

    @serialised  # one call at a time from any threads: the static buffers are shared
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Copy the inputs into the captured static inputs and replay the graph.

        Positions of the caller's cache objects are advanced on the returned objects as eager
        advances them; a call whose positions would end past a layer's capacity (a sliding
        window filling up: other branches of the layer's code) runs the original forward.
        """
        passed_back = self.passes_back(args, kwargs)
        moved: list[tuple[Any, str, int]] = []
        if self.advances:
            given = self.objects if passed_back else nested_cache_objects((args, kwargs))
            for i, name, by in self.advances:
                value = vars(given[i]).get(name)
                capacity = capacity_of(given[i])
                if not isinstance(value, int) or capacity is None or value + by > capacity:
                    self.eager_calls += 1
                    return self.fallback(*args, **kwargs)
                moved.append((self.objects[i], name, value + by))
        slots = self.top_slots
        if slots is not None and len(args) == self.n_args and kwargs.keys() == self.kw_names:
            for where, static in slots:
                copy_into(static, args[where] if isinstance(where, int) else kwargs[where], where)
        elif passed_back:  # the cache's tensors are the static inputs: copy only the others
            root = (args, kwargs)
            for static, path in self.outside:
                copy_into(static, pick(root, path), "input")
        else:
            root = (args, kwargs)
            for (i, static), path in zip(self.tensor_slots, self.paths, strict=True):
                copy_into(static, pick(root, path), i)
        self.graph.replay()
        for obj, name, value in moved:
            obj.__dict__[name] = value
        return self._output()

    def _output(self) -> Any:
        """The caller's outputs of the last replay: clones, or the updated input state."""
        out = self.static_out
        if self.clone_only:
            return out.clone()
        if not self.clone_outputs or isinstance(out, torch.Tensor):  # static, or updated in place
            return out
        return pytree.tree_map(self._fresh, out, is_leaf=is_cache_object)

    def for_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
        """A :class:`DirectReplay` for calls of this call's signature, when one can serve them.

        It can when the call passes tensors and constants at the top level, as the capture's
        call did, no cache position moves and no cache is passed back: then the signature a
        dispatcher keys by says everything the checks of :meth:`__call__` would find.
        """
        slots = self.top_slots
        if (
            slots is None
            or self.advances
            or self.owned_at is not None
            or len(args) != self.n_args
            or kwargs.keys() != self.kw_names
        ):
            return self
        output = self.static_out.clone if self.clone_only else self._output
        return DirectReplay(self, slots, self.graph, output, serial_lock(self))

    def _fresh(self, leaf: Any) -> Any:
        """One output leaf for the caller: a clone, or the updated input state itself."""
        if isinstance(leaf, torch.Tensor):
            return leaf if id(leaf) in self.in_place else leaf.detach().clone()
        if id(leaf) in self.kept_objects:
            return leaf
        if is_cache_object(leaf):
            return map_tensors(lambda t: t if id(t) in self.in_place else t.detach().clone(), leaf)
        return leaf

    def save(self, directory: Path) -> dict[str, Any]:
        """Write nothing: a captured graph holds device addresses, so load captures again."""
        # A captured graph holds device addresses and cannot be written to disk; load captures
        # again from placeholder inputs of the same signature.
        return {"recapture_on_load": True}


ShapeKey = tuple[tuple[int, ...], ...]
"""The shapes of one call's tensor inputs, in a fixed order: which capture serves it."""


def _shape_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ShapeKey:
    """The call's tensor shapes: positional tensors, then keyword tensors by name.

    Nested inputs go through a full flatten.
    """
    top = [*args, *(kwargs[k] for k in sorted(kwargs))]
    if all(isinstance(v, (torch.Tensor, *CONSTANT_TYPES)) for v in top):
        return tuple(tuple(v.shape) for v in top if isinstance(v, torch.Tensor))
    leaves, _ = flatten((args, dict(sorted(kwargs.items()))))
    return tuple(tuple(v.shape) for v in leaves if isinstance(v, torch.Tensor))


def _shared_pool(backend: DeviceGraph, device: torch.device) -> Any:
    """A memory pool the captures of one runner share, or None where sharing is not safe.

    With ``clone_outputs=False`` a caller keeps the static outputs, which live in the pool and
    would be overwritten by another capture's replay: each capture keeps its own pool then.
    """
    if not backend.clone_outputs:
        return None
    handle = graph_api(device).pool_handle
    return handle() if handle is not None else None


class ShapeSetRunner(Runner):
    """Device graphs for a ranged graph: one capture per distinct input shape.

    At most ``backend.max_shapes`` captures. The recorded shapes are captured at build; a new
    shape inside the range is captured on its first call while there is room; calls of further
    shapes run the original forward (counted in :attr:`eager_calls`). ``str(runner)`` says
    which shapes are served by replays. The captures share one memory pool for their
    intermediates (with ``clone_outputs``), so the set costs about one capture's working
    memory, not one per shape.
    """

    releasable = False  # see Runner.releasable

    def __init__(
        self,
        backend: DeviceGraph,
        module: nn.Module,
        key: GraphKey,
        device: torch.device,
        samples: Sequence[Sample] = (),
    ) -> None:
        super().__init__(backend)
        self.module = module
        self.key = key
        self.device = device
        self.max_shapes = backend.max_shapes
        self.forward = original_forward(module)
        self.captures: dict[ShapeKey, DeviceGraphRunner] = {}
        self.eager_calls = 0
        self.lock = threading.RLock()  # also every capture's serial lock (they share the pool)
        self._owners: dict[int, DeviceGraphRunner] = {}
        """The capture that owns each cache object the captures return (see ``owned_ids``)."""
        self._owned_ids: frozenset[int] = frozenset()
        self.compiled = (
            torch.compile(fresh_entry(self.forward), mode=backend.compile_mode, dynamic=None)
            if backend.compile
            else None
        )
        """With ``compile=True``, one compiled forward for every capture: the second shape
        compiles it with dynamic sizes, which serve every later shape (a compile per shape
        would multiply the build time by the number of shapes)."""
        self.pool = _shared_pool(backend, device)
        """One memory pool for every capture's working memory (None: one pool each). Replays
        run one after another, and every output that lives in the pool is cloned right after
        its replay, so what one capture leaves there is never read after another's replay."""
        for sample in samples:
            shapes = _shape_key(tuple(sample.args), sample.kwargs)
            if shapes not in self.captures and len(self.captures) < self.max_shapes:
                self._add(shapes, self._runner(sample))
        self.recorded = frozenset(self.captures)
        """The shapes captured at build (the recorded calls'): :meth:`end_checks` keeps them."""

    def _runner(self, sample: Sample) -> DeviceGraphRunner:
        assert isinstance(self.backend, DeviceGraph)
        return DeviceGraphRunner(
            self.backend, self.module, sample, self.device, compiled=self.compiled, pool=self.pool
        )

    def _add(self, shapes: ShapeKey, capture: DeviceGraphRunner) -> None:
        self.captures[shapes] = capture
        capture.serial = self.lock  # captures sharing the pool replay one at a time
        for owned in capture.owned_ids():
            self._owners[owned] = capture
        self._owned_ids = frozenset(self._owners)

    def owned_ids(self) -> frozenset[int]:
        """The cache objects every capture returns (a call passing one back skips the walk)."""
        return self._owned_ids

    def end_checks(self) -> None:
        """Drop the captures made for tuning's probes; a served call of such a shape captures again.

        Safe with the shared pool: a dropped capture's memory there goes back to the pool (which
        the recorded shapes' captures keep alive), where only a later capture can take it. A
        runner with no recorded shape (loaded from a checkpoint) keeps everything, so its pool
        is never released while it may capture into it again.
        """
        if not self.recorded:
            return
        with self.lock:
            for shapes in [s for s in self.captures if s not in self.recorded]:
                capture = self.captures.pop(shapes)
                for owned in capture.owned_ids():
                    self._owners.pop(owned, None)
            self._owned_ids = frozenset(self._owners)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Replay the capture for this call's shapes (captured now if there is room), else eager."""
        if self._owners:
            owner = self._passed_back(args, kwargs)
            if owner is not None:
                return owner(*args, **kwargs)
        shapes = _shape_key(args, kwargs)
        capture = self.captures.get(shapes)
        if capture is None:
            capture = self._capture(shapes, args, kwargs)
            if capture is None:
                self.eager_calls += 1
                return self.forward(*args, **kwargs)
        return capture(*args, **kwargs)

    def for_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
        """The capture for this call's shapes (its direct replay where it has one), if any.

        Self while no capture serves those shapes, or while a capture owns state (a call
        passing a cache back is routed by the object, call by call).
        """
        if self._owners:
            return self
        capture = self.captures.get(_shape_key(args, kwargs))
        return self if capture is None else capture.for_call(args, kwargs)

    def _passed_back(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The capture whose cache object the call passes back (its other inputs fitting)."""
        for value in (*args, *kwargs.values()):
            capture = self._owners.get(id(value))
            if capture is not None:
                fits = capture.passes_back(args, kwargs) and capture.fits_passed_back(args, kwargs)
                return capture if fits else None
        return None

    def _capture(
        self, shapes: ShapeKey, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> DeviceGraphRunner | None:
        with self.lock:
            if shapes in self.captures:
                return self.captures[shapes]
            if len(self.captures) >= self.max_shapes:
                return None
            capture = self._runner(Sample(args, kwargs))
            self._add(shapes, capture)
            return capture

    @property
    def served_shapes(self) -> list[ShapeKey]:
        """The input shapes replayed from a captured graph, in capture order."""
        return list(self.captures)

    def __str__(self) -> str:
        shapes = "; ".join(
            ", ".join("[" + ",".join(map(str, s)) + "]" for s in shape) for shape in self.captures
        )
        return (
            f"{self.backend.name} for {self.key}: {len(self.captures)} of at most "
            f"{self.max_shapes} shapes captured ({shapes or 'none yet'}); others run eager"
        )

    def save(self, directory: Path) -> dict[str, Any]:
        """Write nothing: captures hold device addresses, so load captures again shape by shape."""
        # Captures hold device addresses: a loaded runner captures again, shape by shape.
        return {"recapture_on_load": True}


@dataclasses.dataclass(frozen=True)
class DeviceGraph(Backend):
    """Capture the module's forward in a CUDA graph (XPU graph on Intel GPUs) and replay it.

    Keeps results: the replay runs the very kernels eager runs, without the launch cost of
    each. A capture has static shapes: one capture per graph, or for a ranged graph one per
    input shape (the recorded ones at build, new ones on their first call).

    Args:
        compile: Capture the Inductor-compiled forward instead of eager.
        compile_mode: ``torch.compile``'s mode under ``compile``; one that captures graphs
            itself is refused.
        clone_outputs: False returns the static output tensors themselves: faster, but the
            next call overwrites them.
        max_shapes: The most captures of a ranged graph; beyond it a call runs eager.
        decode_only: Build only for graphs whose inputs hold a cache object (decode steps on
            a static cache, one shape each), where a compiled capture is worth its compile;
            other graphs get a row saying so.

    Raises:
        InvalidInputError: ``max_shapes`` below 1, or a ``compile_mode`` that captures graphs.

    Example:
        >>> import torch, tunetree as tt
        >>> backend = tt.backends.DeviceGraph(max_shapes=4)
        >>> backend.unavailable_reason(torch.device("cpu"))
        'device graphs need a CUDA or XPU device'
        >>> model = torch.nn.Linear(8, 8).cuda().eval()  # doctest: +SKIP
        >>> result = tt.tune(model, [torch.randn(2, 8, device="cuda")],
        ...     strategy=tt.OneBackendStrategy(backend))  # doctest: +SKIP
    """

    kind: ClassVar[str] = "device-graph"
    stoppable_build: ClassVar[bool] = False  # never interrupted mid-capture (see Backend)
    typical_build_s: ClassVar[float | None] = 1.0  # warm-up and one capture of eager's kernels
    compile: bool = False
    compile_mode: str | None = "max-autotune-no-cudagraphs"
    clone_outputs: bool = True
    max_shapes: int = 16
    decode_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_shapes, int) or self.max_shapes < 1:
            raise InvalidInputError(
                f"max_shapes must be a positive integer, not {self.max_shapes!r}"
            )
        if self.compile_mode in _CUDA_GRAPH_MODES:
            raise InvalidInputError(
                f"compile_mode={self.compile_mode!r} captures CUDA graphs itself and cannot be "
                "nested in a device graph; use 'max-autotune-no-cudagraphs' or None"
            )

    def build_prior_s(self) -> float | None:
        """A capture takes about a second; with ``compile``, Inductor's compile comes first."""
        return 12.0 if self.compile else self.typical_build_s

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why device graphs (and compile, if asked) cannot run on ``device``, or None."""
        if device.type == "cuda":
            if not torch.cuda.is_available():
                return "CUDA is not available here (torch.cuda.is_available() is False)"
        elif device.type == "xpu":
            if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
                return "XPU is not available here (torch.xpu.is_available() is False)"
            if not hasattr(torch.xpu, "XPUGraph"):
                return "this PyTorch has no torch.xpu.XPUGraph; XPU graphs need a newer PyTorch"
        else:
            return "device graphs need a CUDA or XPU device"
        if self.compile:
            return compile_unavailable_reason(device)
        return None

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        """Capture the recorded sample; for a ranged graph, one capture per recorded shape."""
        if not graph.samples:
            raise BackendError("a device graph needs one recorded sample to capture")
        if self.decode_only and not any(sample.stateful for sample in graph.samples):
            raise BackendError(
                "decode_only: built only for calls that take a cache object (decode steps)"
            )
        if graph.key.is_dynamic:
            return ShapeSetRunner(self, module, graph.key, device, graph.samples)
        return DeviceGraphRunner(self, module, graph.samples[0], device)

    def check_saved_runner(self, key: GraphKey, saved: Any, max_elements: int) -> None:
        """Placeholders shaped like ``key`` within ``max_elements`` (a load captures from them).

        The captures are made from ``key`` itself, so their shapes are the graph's.
        """
        check_placeholders(key, max_elements)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        """Capture again from placeholder inputs shaped like ``key`` (nothing is read from disk)."""
        if key.is_dynamic:
            return ShapeSetRunner(self, module, key, device)
        return DeviceGraphRunner(self, module, sample_from_key(key, device), device)
