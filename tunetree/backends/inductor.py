"""torch.compile with the Inductor backend."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import BackendError, InvalidInputError
from ..signature.binding import original_forward
from ..signature.graph import Graph, GraphKey, Sample, detach_clone
from .base import Backend, Runner
from .packages import install_hint, missing_packages
from .ranges import (
    AxisDims,
    axis_dims,
    call_sizes,
    example_sizes,
    resize_sample,
    sample_tensors,
)
from .safe_config import check_choice, check_fields, refuse

log = logging.getLogger(__name__)

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``torch.compile`` modes a saved Inductor config may name."""
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""``torch.compile`` modes that replay CUDA graphs: each replay overwrites its outputs."""

SAFE_OPTIONS: dict[str, type] = {
    "max_autotune": bool,
    "max_autotune_pointwise": bool,
    "max_autotune_gemm": bool,
    "epilogue_fusion": bool,
    "coordinate_descent_tuning": bool,
    "aggressive_fusion": bool,
    "freezing": bool,
    "shape_padding": bool,
    "permute_fusion": bool,
    "size_asserts": bool,
    "triton.cudagraphs": bool,
    "triton.cudagraph_trees": bool,
    "triton.unique_kernel_names": bool,
    "cpp.simdlen": int,
    "cpp.threads": int,
    "cpp.enable_kernel_profile": bool,
    "cpp.weight_prepack": bool,
}
"""Inductor options a saved config may set, with their value types: switches and small
numbers only. Anything else (``cpp.cxx``, ``cpp.march``, ``trace.debug_dir``, ...) can name a
program, a compiler flag or a path, and needs ``trust_config=True``."""


def check_inductor_options(kind: str, options: Any) -> None:
    """Refuse Inductor options that are not on :data:`SAFE_OPTIONS` with their type."""
    pairs: list[Any] = list(options.items()) if isinstance(options, dict) else options
    if not isinstance(pairs, list | tuple) or len(pairs) > len(SAFE_OPTIONS):
        raise refuse(kind, "options", "is not a short list of (name, value) pairs")
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise refuse(kind, "options", "holds something other than (name, value) pairs")
        name, value = pair
        want = SAFE_OPTIONS.get(name) if isinstance(name, str) else None
        if want is None:
            raise refuse(kind, f"options.{str(name)[:80]}", "is not a known-safe Inductor option")
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if not ok or (want is int and not 0 <= value <= 4096):
            raise refuse(kind, f"options.{name}", f"is {str(value)[:40]!r}, not a {want.__name__}")


STATEFUL_REFUSAL = (
    "not tried on a call that takes a cache object (a decode step): torch.compile recompiles "
    "as the cache grows, and its compiled code for such ranged graphs has aborted the whole "
    "process (c10 'Cannot call numel() on tensor with symbolic sizes', torch 2.13 on GPT-2 "
    "generate); the exporting backends, and device graphs on a static cache, serve it"
)
"""Why Inductor refuses graphs whose inputs hold a cache object."""


def fresh_entry(forward: Any) -> Any:
    """A function calling ``forward`` that has a code object of its own.

    Dynamo keeps its compiled-graph cache on the code object it compiles. ``torch.compile``
    of a ``torch.nn`` forward goes through one shared wrapper, so after eight modules the
    recompile limit is hit and later ones silently run eager. Compiling a fresh entry
    function per runner gives each runner its own cache.
    """

    def entry(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    entry.__code__ = entry.__code__.replace()
    return entry


def compile_unavailable_reason(device: torch.device, what: str = "compile=True") -> str | None:
    """Why ``torch.compile`` cannot run on ``device`` here (Inductor on CUDA needs triton)."""
    if device.type == "cuda" and missing_packages("triton"):
        return f"{what} on CUDA needs triton ({install_hint(Inductor)})"
    return None


class InductorRunner(Runner):
    """A ``torch.compile``-d original forward, compiled on the first call.

    A runner loaded from a checkpoint therefore recompiles from the module (Inductor's own
    on-disk cache makes that fast on the machine that tuned it).

    For a ranged graph the first compile is of the first call resized to sizes of 2 or more
    (:func:`.ranges.example_sizes`), with every dynamic axis marked dynamic and backed sizes
    treated size-obliviously, so that one compiled graph serves the whole range (checked at
    the range's ends; a graph that guards a narrower range is compiled again with soft marks);
    when it guards size 1 out, a second graph is compiled for it while building
    (:meth:`_compile_size_one`). :attr:`compiles` counts the graphs compiled so far.
    """

    def __init__(self, backend: Inductor, module: nn.Module, key: GraphKey | None = None) -> None:
        super().__init__(backend)
        self.forward = original_forward(module)
        self.entry, self.compiled = self._fresh_compile()
        self.clone_outputs = backend.mode in CUDA_GRAPH_MODES
        self.key = key if key is not None and key.is_dynamic else None
        self.range_key = self.key
        """The ranged graph this runner compiles for (None: a graph of fixed sizes)."""
        self.ranged = self.key is not None
        self._accepted: set[tuple[Any, ...]] = set()
        self.eager_calls = 0
        """Calls served by the original forward because serving them would have compiled."""
        self.soft_axes: list[AxisDims] | None = None
        """Per input tensor, its dynamic axes, once they had to be marked softly (see
        :meth:`_compile_for_range`): every call marks them so recompiles stay dynamic."""

    def _fresh_compile(self) -> tuple[Any, Any]:
        """A new entry function and its ``torch.compile`` (an empty Dynamo cache)."""
        backend = self.backend
        assert isinstance(backend, Inductor)
        entry = fresh_entry(self.forward)
        compiled = torch.compile(
            entry,
            mode=backend.mode,
            dynamic=backend.dynamic,
            fullgraph=backend.fullgraph,
            options=dict(backend.options) or None,
        )
        return entry, compiled

    @property
    def compiles(self) -> int:
        """How many graphs Dynamo compiled for this runner (1 when no call recompiled)."""
        return len(_debug_get_cache_entry_list(self.entry.__code__))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the compiled forward (compiling on the first call); clone outputs when configured.

        Calls run without autograd, as every runner's: a tuned model serves inference, and a
        call with grad mode on would otherwise compile again. A ranged graph's runner never
        compiles after its first compile: a call its compiled graph does not accept (a size
        its guards exclude, another layout) runs the original forward instead (counted in
        :attr:`eager_calls`, logged once), since a compile takes seconds.
        """
        if torch.is_grad_enabled():  # entering no_grad costs a microsecond: only when needed
            with torch.no_grad():
                out = self._call(args, kwargs)
        else:
            out = self._call(args, kwargs)
        return detach_clone(out) if self.clone_outputs else out

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.key is not None:
            self._compile_for_range(args, kwargs)
        if self.soft_axes is not None:
            _mark_axes(Sample(args, kwargs), self.soft_axes, soft=True)
            with _size_oblivious():
                return self.compiled(*args, **kwargs)
        if self.ranged:
            return self._without_recompiles(args, kwargs)
        return self.compiled(*args, **kwargs)

    def _without_recompiles(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The compiled call, or the original forward where it would compile.

        A layout of top-level tensors served compiled once is served again without the
        ``fail_on_recompile`` stance (about 5 us a call): Dynamo's guards on it passed, and
        they read nothing else that changes between calls of one graph.
        """
        layout = _layout(args, kwargs)
        if layout is not None and layout in self._accepted:
            return self.compiled(*args, **kwargs)
        served, out = self._compiled_if_compiled(args, kwargs)
        if served:
            if layout is not None and len(self._accepted) < MAX_ACCEPTED_LAYOUTS:
                self._accepted.add(layout)
            return out
        if self.compiles == 0 and self.range_key is not None:
            # torch._dynamo.reset() emptied the cache: compile for the range again, once.
            log.info("Inductor: Dynamo's cache was reset; compiling for %s again", self.range_key)
            self.key, self._accepted = self.range_key, set()
            self._compile_for_range(args, kwargs)
            return self._without_recompiles(args, kwargs)
        if not self.eager_calls:
            log.info(
                "Inductor: a call its compiled graph does not accept (%s) runs the original "
                "forward; no compile happens while serving",
                ", ".join(str(tuple(t.shape)) for t in _tensors(args, kwargs)),
            )
        self.eager_calls += 1
        return self.forward(*args, **kwargs)

    def _compiled_if_compiled(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[bool, Any]:
        """The compiled call's output, unless it would compile first.

        Returns ``(True, output)``, or ``(False, None)`` when Dynamo would compile
        (``fail_on_recompile``: nothing compiled, nothing run).
        """
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return True, self.compiled(*args, **kwargs)
        except RuntimeError as exc:
            if "fail_on_recompile" not in str(exc):
                raise
        return False, None

    def _compile_for_range(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Compile once from this call resized to the example sizes, dynamic axes marked."""
        key, self.key = self.key, None
        assert key is not None
        leaves, _, where = sample_tensors(Sample(args, kwargs))
        dims = axis_dims(key)
        sizes = example_sizes(key.dims(), call_sizes([leaves[i] for i in where], dims))
        example = resize_sample(Sample(args, kwargs), key, sizes)
        _mark_axes(example, dims, soft=False)
        try:
            with _size_oblivious(), _quiet_constraint_errors():
                self.compiled(*example.args, **example.kwargs)
        except Exception as exc:
            if "ConstraintViolation" not in f"{type(exc).__name__}: {exc}":
                raise
            log.info(
                "Inductor: the compiled graph fixes a dynamic axis of %s (%s); "
                "compiling with soft dynamic axes, so other sizes compile again",
                key,
                str(exc).splitlines()[0][:200],
            )
        else:
            ends = self._unserved_range_end(Sample(args, kwargs), key, sizes)
            if ends is None:
                self._compile_size_one(Sample(args, kwargs), key, dims, sizes)
                return
            log.info(
                "Inductor: the compiled graph does not serve %s of %s; compiling with soft "
                "dynamic axes, so sizes outside its guards compile again",
                ends,
                key,
            )
        # Some kernels choose by size (a guard like ``16 <= batch``): mark the axes softly, so
        # Dynamo keeps them symbolic where it can and recompiles across such a guard.
        self.entry, self.compiled = self._fresh_compile()
        self.soft_axes = dims
        example = resize_sample(Sample(args, kwargs), key, sizes)
        _mark_axes(example, dims, soft=True)
        with _size_oblivious():
            self.compiled(*example.args, **example.kwargs)

    def _unserved_range_end(self, call: Sample, key: GraphKey, sizes: dict[str, int]) -> str | None:
        """The first end of the range the compiled graph would compile again for, or None.

        Axes are marked without their min and max (see :func:`_mark_axes`), so a graph that
        guards a narrower range (``16 <= batch``: a CNN's convolution chooses its kernel by
        batch) compiles without complaint; running it, without compiling, at every
        dimension's largest size at once and at each one's smallest of 2 or more (size 1 is
        :meth:`_compile_size_one`'s) finds such a guard.
        """
        bounds = key.dims()
        names = sorted(bounds)
        ends = [{**sizes, **{n: bounds[n].max for n in names}}]
        ends += [{**sizes, n: max(bounds[n].min, 2)} for n in names if bounds[n].max >= 2]
        for end in ends:
            if end == sizes:
                continue
            example = resize_sample(call, key, end)
            with _size_oblivious():
                served, _ = self._compiled_if_compiled(example.args, example.kwargs)
            if not served:
                return ", ".join(f"{n}={end[n]}" for n in names)
        return None

    def _compile_size_one(
        self, call: Sample, key: GraphKey, dims: list[AxisDims], sizes: dict[str, int]
    ) -> None:
        """Compile a second graph for size 1 of each dimension whose range starts at 1.

        Dynamo specializes sizes 0 and 1, so a graph compiled at sizes of 2 or more may guard
        ``2 <= batch`` (BERT does): batch-1 calls, common in serving, would then run the
        original forward. One more compile while building, with that dimension at 1 and the
        others still dynamic, serves them compiled. Skipped when the graph serves size 1
        already; a failed compile leaves such calls to the original forward, as before.
        """
        starting_at_one = {d.name for axes in dims for d in axes.values() if d.min == 1}
        for name in sorted(starting_at_one)[:MAX_SIZE_ONE_VARIANTS]:
            example = resize_sample(call, key, {**sizes, name: 1})
            with _size_oblivious():
                served, _ = self._compiled_if_compiled(example.args, example.kwargs)
            if served:
                continue  # the graph compiled for the range serves size 1 already
            others = [{a: d for a, d in axes.items() if d.name != name} for axes in dims]
            _mark_axes(example, others, soft=False)
            try:
                with _size_oblivious(), _quiet_constraint_errors():
                    self.compiled(*example.args, **example.kwargs)
            except Exception as exc:
                log.info("Inductor: no compiled graph for %s=1 (%s)", name, str(exc)[:200])


def _layout(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """Shapes, strides and grad flags of a call's top-level tensors, with its constants.

    None when an argument is anything else (a container, a cache object): such calls always
    take the stance.
    """
    found: list[Any] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append((value.shape, value.stride(), value.requires_grad))
        elif value is None or isinstance(value, bool | int | float | str):
            found.append((type(value), value))
        else:
            return None
    return (*found, *kwargs)


MAX_ACCEPTED_LAYOUTS = 4096
"""Most call layouts a ranged runner remembers as served compiled."""

MAX_SIZE_ONE_VARIANTS = 2
"""Most dimensions a ranged Inductor runner compiles a size-1 graph for (one compile each)."""


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    leaves, _, where = sample_tensors(Sample(args, kwargs))
    return [leaves[i] for i in where]


class _DropGuardErrors(logging.Filter):
    """Drops torch's guard-creation ERROR records (a refused range logs its traceback there)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


@contextlib.contextmanager
def _quiet_constraint_errors() -> Any:
    """While compiling for a marked range, keep torch from logging the refusal we recover from.

    A filter on torch's guard logger, removed afterwards; no logger's level or handlers change.
    Any other failure in that window still raises, and the runner re-raises it.
    """
    guards = logging.getLogger("torch._guards")
    drop = _DropGuardErrors()
    guards.addFilter(drop)
    try:
        yield
    finally:
        guards.removeFilter(drop)


def _mark_axes(sample: Sample, dims: list[AxisDims], soft: bool) -> None:
    """Mark each tensor's dynamic axes for Dynamo.

    Hard marks (``mark_dynamic``) make a compile that specializes an axis to one size fail;
    soft ones (``maybe_mark_dynamic``) let Dynamo guard and recompile. Hard marks carry no
    min and max: with a known largest size Inductor may choose kernels whose Triton compile
    does not end (a fused softmax compiled as a persistent reduction, many times the
    unbounded compile's time); the range's ends are checked after the
    compile instead (:meth:`InductorRunner._unserved_range_end`).
    """
    leaves, _, where = sample_tensors(sample)
    for i, axes in zip(where, dims, strict=True):
        for axis in axes:
            if soft:
                torch._dynamo.maybe_mark_dynamic(leaves[i], axis)
            else:
                torch._dynamo.mark_dynamic(leaves[i], axis)


def _debug_get_cache_entry_list(code: Any) -> list[Any]:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list as entries

    return list(entries(code))


def _size_oblivious() -> Any:
    """Treat dynamic sizes size-obliviously while compiling.

    Otherwise a graph compiled for sizes >= 2 guards against size 1 and recompiles for it.
    """
    import torch.fx.experimental._config as fx_config

    if hasattr(fx_config, "backed_size_oblivious"):
        return getattr(fx_config, "patch")(backed_size_oblivious=True)  # noqa: B009 - untyped
    return contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class Inductor(Backend):
    """``torch.compile(backend="inductor")``.

    Args:
        mode: None, ``"reduce-overhead"``, ``"max-autotune"`` or
            ``"max-autotune-no-cudagraphs"``.
        dynamic: ``torch.compile``'s ``dynamic``; ranged graphs are marked dynamic anyway.
        fullgraph: Refuse a graph break.
        options: Inductor config entries, as ``(name, value)`` pairs or a dict; a saved one
            is checked against a list of known-safe options.

    Raises:
        InvalidInputError: Both ``mode`` and ``options`` given.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.Inductor(mode="max-autotune").kind
        'inductor'
    """

    kind: ClassVar[str] = "inductor"
    typical_build_s: ClassVar[float | None] = 12.0  # docs/measurements.md
    libraries: ClassVar[tuple[str, ...]] = ("triton",)
    quick_build: ClassVar[bool] = False
    mode: str | None = None
    dynamic: bool | None = False
    fullgraph: bool = False
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.mode is not None and self.options:
            raise InvalidInputError(
                "torch.compile takes either mode or options, not both: put the mode's settings "
                "into options (e.g. {'max_autotune': True}) or drop the options"
            )
        if isinstance(self.options, dict):
            object.__setattr__(self, "options", tuple(sorted(self.options.items())))
        elif isinstance(self.options, list):
            object.__setattr__(self, "options", tuple(tuple(o) for o in self.options))

    @classmethod
    def check_saved_config(cls, config: Any) -> None:
        """Known fields; a known mode; options only from :data:`SAFE_OPTIONS`."""
        check_fields(cls.kind, cls, config)
        check_choice(cls.kind, "mode", config.get("mode"), MODES)
        check_choice(cls.kind, "dynamic", config.get("dynamic"), (None, True, False))
        check_choice(cls.kind, "fullgraph", config.get("fullgraph", False), (True, False))
        check_inductor_options(cls.kind, config.get("options", ()))

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why Inductor cannot compile for ``device`` in this mode, or None."""
        reason = compile_unavailable_reason(device, "Inductor")
        if reason:
            return reason
        if self.mode in ("reduce-overhead",) and device.type == "cpu":
            return "mode='reduce-overhead' uses CUDA graphs and needs a CUDA device"
        return None

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        """Return a runner that compiles the original forward on its first call.

        A graph whose inputs hold a cache object (a decode step) is refused before anything
        is compiled: see :data:`STATEFUL_REFUSAL`.
        """
        if any(sample.stateful for sample in graph.samples):
            raise BackendError(STATEFUL_REFUSAL)
        return InductorRunner(self, module, graph.key)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        """Return a runner that compiles again from the module (nothing is read from disk)."""
        return InductorRunner(self, module, key)
