"""The backend protocol: a backend builds a runner for one graph of one module.

A backend is a small frozen dataclass whose fields are its configuration. It says
why it cannot run on a device (:meth:`Backend.unavailable_reason`) instead of
failing late, builds a :class:`Runner` for one graph, and loads a runner that a
previous :meth:`Runner.save` wrote.

A concrete subclass that declares its own ``kind`` registers itself under that kind just by
being defined (:meth:`Backend.__init_subclass__` refuses a kind another class already
declares); :mod:`tunetree.backends.registry` finds it by walking the subclasses.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import BackendError
from ..signature.compare import Tolerances
from ..signature.graph import Graph, GraphKey
from .safe_config import check_plain


class Runner(ABC):
    """A built candidate: called like the module's forward for one graph.

    :meth:`Backend.build` returns one; tuning checks it against eager before it serves.

    Args:
        backend: The backend that built it.
    """

    served: GraphKey | None = None
    """Set by a loader whose artifact serves less than the graph it was loaded for: the
    narrower graph it does serve, under which the runner is then wrapped (calls outside it
    take the original forward)."""

    releasable: bool = True
    """Whether tuning may drop this runner once it lost (``GraphResult.release_runners``): a
    loser's session and thread pool must not slow what is measured after it. False for
    device graphs: dropping the losing captures of a decode graph can make the winner's first
    served ``generate`` fault (an illegal memory access), and they hold device memory, not
    threads."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @abstractmethod
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the graph; returns outputs with eager's structure and types."""

    def save(self, directory: Path) -> dict[str, Any]:
        """Write artifacts into ``directory`` and return the runner's saved record.

        ``directory`` exists and is empty; the record is small JSON data that
        :meth:`Backend.load` takes back.
        """
        return {}

    def owned_ids(self) -> frozenset[int]:
        """Ids of the state objects this runner returned and owns (a device graph's cache).

        A call that passes one back (``generate`` does, step after step) is keyed by that
        object's identity instead of by its contents (:func:`tunetree.signature.binding.
        call_signature`): the runner checks what it needs of it itself. The default: none.
        """
        return frozenset()

    def for_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
        """What serves every call of exactly this call's signature.

        ``self``, or the one part of this runner that does (a capture per shape, or that
        capture's replay without the checks the signature makes needless), which a dispatcher
        that remembers the signature then calls directly. Asked after the call ran.
        """
        return self

    def end_checks(self) -> None:
        """Told that tuning's checks on calls it made up (probes of other sizes) are over.

        A runner may drop what it built for those calls alone and build it again when a served
        call needs it: a device graph captures each new shape, and each capture holds a copy of
        its inputs (a decode step's whole cache, a large share of tuning's peak memory). The
        default keeps everything.
        """
        return

    def serve_alone(self) -> None:
        """Told that this runner serves the whole model in a process that does nothing else.

        Only on the user's request (:func:`tunetree.serve_alone`): a runner may then trade
        idle CPU for latency (ONNX Runtime lets its threads spin). Never done by default,
        since spinning threads slow whatever else the process runs between calls. The
        default does nothing.
        """
        return


@dataclasses.dataclass(frozen=True)
class Backend(ABC):
    """Base of every backend. Subclasses are frozen dataclasses; their fields are the config.

    A subclass declares ``kind`` (registering it by being defined), ``libraries``, ``extra``,
    and implements :meth:`unavailable_reason` and :meth:`build` (and :meth:`load` with
    ``Runner.save`` when its runners can be stored). docs/architecture.md says how to add one.

    Example:
        >>> import dataclasses, typing, tunetree as tt
        >>> from tunetree.backends.eager import EagerRunner
        >>> @dataclasses.dataclass(frozen=True)
        ... class Mine(tt.backends.Backend):
        ...     kind: typing.ClassVar[str] = "doc-example-mine"
        ...     def build(self, module, graph, device):
        ...         return EagerRunner(self, module)
        >>> tt.backends.backend_type("doc-example-mine") is Mine
        True
    """

    kind: ClassVar[str] = "backend"
    """Stable identifier, stored in checkpoints and cache keys."""
    preserves_results: ClassVar[bool] = True
    """False for backends that change numbers (quantisation, bf16): never chosen by default."""
    extra: ClassVar[str | None] = None
    """The pip extra that installs this backend's package, named in install hints."""
    libraries: ClassVar[tuple[str, ...]] = ()
    """Pip distributions whose versions decide what this backend builds (recorded in the
    environment of checkpoints and cache entries)."""
    load_imports: ClassVar[tuple[str, ...]] = ()
    """Modules that loading a saved runner imports and whose first import holds the GIL for
    long (a C extension's initialisation): ``tt.jit`` imports them before it serves, so that
    loading a plan beside serving threads never stalls them."""
    quick_build: ClassVar[bool] = True
    """False for backends whose builds take seconds per graph (compilers): left out of
    :func:`tunetree.quick_strategy` (``auto_tune(quick=True)``)."""
    stoppable_build: ClassVar[bool] = True
    """Whether a time budget may stop a build still running past its share by raising in the
    building thread (:func:`tunetree.candidates.budget.stopped_after`). False where an
    exception raised between two Python instructions of the build could leave process-wide
    state half changed (a device graph's capture: the stream's capture mode, the allocator's
    private pool): the budget then only decides whether to start the build."""
    typical_build_s: ClassVar[float | None] = None
    """Seconds a build of a small graph (about 30 modules, a two-layer transformer) typically
    takes on a small CPU (two cores), with its first run; None: unknown. The time budget scales
    it by how much slower this machine built the other backends. A time budget orders and skips
    builds by it until this backend has been built in the tune (see :meth:`build_prior_s`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register a subclass that declares its own ``kind``.

        The kind must be a non-empty string that no other live backend class declares. A class
        defined again under the same module and name (a reloaded module, a test run twice)
        replaces the old one. Subclasses that inherit their parent's kind are variants of it,
        not registered.
        """
        super().__init_subclass__(**kwargs)
        if "kind" not in cls.__dict__:
            return
        kind = cls.__dict__["kind"]
        if not isinstance(kind, str) or not kind.strip():
            del cls.kind  # the refused class stays unreachable until it is collected
            raise BackendError(f"{_qualified(cls)}.kind must be a non-empty string, not {kind!r}")
        for other in backend_classes():
            if other is not cls and other.kind == kind and _qualified(other) != _qualified(cls):
                del cls.kind
                raise BackendError(
                    f"backend kind {kind!r} of {_qualified(cls)} is already declared by "
                    f"{_qualified(other)}: every backend class needs a kind of its own"
                )

    @property
    def name(self) -> str:
        """Readable name: the kind plus every option that differs from its default."""
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.default is not dataclasses.MISSING and getattr(self, f.name) != f.default
        ]
        return f"{self.kind}({', '.join(changed)})" if changed else self.kind

    def config(self) -> dict[str, Any]:
        """The configuration as JSON-serialisable data (``type(self)(**config)`` rebuilds it)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def check_saved_config(cls, config: Mapping[str, Any]) -> None:
        """Refuse a config read from a file that could name programs, paths or code.

        Raises :class:`~tunetree.errors.UntrustedConfigError`. The default admits this class's
        fields holding plain scalars; backends whose fields reach a library's options narrow that
        with allow-lists (see :mod:`tunetree.backends.safe_config`).
        """
        check_plain(cls.kind, cls, config)

    def build_prior_s(self) -> float | None:
        """This configuration's typical build time (:attr:`typical_build_s`, None: unknown)."""
        return self.typical_build_s

    def tolerances(self) -> Tolerances | None:
        """Tolerances this backend is checked with, or None for the tune's tolerances."""
        return None

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why this backend cannot run on ``device`` here, or None when it can."""
        return None

    @abstractmethod
    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        """Build a runner for ``graph``.

        ``module`` runs its original forward; samples and the module are on ``device``. Raise
        anything on failure: the caller records it.
        """

    def check_saved_runner(self, key: GraphKey, saved: Any, max_elements: int) -> None:
        """Refuse a saved runner record (from a file: untrusted) that does not fit ``key``.

        Runs before anything is read or built, with neither the module nor the artifacts
        (``tunetree info`` runs it too); ``max_elements`` bounds what the record may make a
        load allocate. Raises :class:`~tunetree.errors.BackendError`; the default has
        nothing to check (backends that rebuild from the module alone).
        """
        return None

    def check_saved_artifacts(
        self, key: GraphKey, directory: Path, saved: dict[str, Any]
    ) -> GraphKey | None:
        """Read the saved runner's artifacts in ``directory`` and check them, without the module.

        The very checks :meth:`load` makes of them (element types, fixed sizes and ranges the
        artifacts declare against the record ``saved`` and ``key``), with the backend's own
        reader, importing and unpickling nothing the files name, so ``tunetree info`` runs
        them too. Returns the part of ``key`` the artifacts serve, or None for a backend
        that reads no artifact (it rebuilds from the module). Raises
        :class:`~tunetree.errors.BackendError` on a mismatch.
        """
        return None

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        """Rebuild a runner from ``directory`` and the record ``saved``.

        ``saved`` is the record that :meth:`Runner.save` returned.
        """
        raise BackendError(f"backend {self.kind!r} cannot load saved runners")

    def __str__(self) -> str:
        return self.name

    def __deepcopy__(self, memo: dict[int, Any]) -> Backend:
        # Backends are immutable configurations: copying a strategy shares them.
        return self


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChangesResults(Backend):
    """Base of opt-in backends that change numbers (quantisation, reduced precision).

    Never in the default strategy; checked against eager with the looser tolerance
    ``atol + rtol * |eager|`` that the user sets here, and labelled in every table. Under an
    accuracy budget such a candidate is admitted by its measured error instead.

    Args:
        atol: Absolute tolerance (keyword-only).
        rtol: Relative tolerance (keyword-only).

    Example:
        >>> import tunetree as tt
        >>> isinstance(tt.backends.OpenVINOBf16(atol=0.1), tt.backends.ChangesResults)
        True
    """

    preserves_results: ClassVar[bool] = False
    atol: float = 5e-2
    rtol: float = 5e-2

    def tolerances(self) -> Tolerances:
        """Uniform tolerances from this backend's ``atol`` and ``rtol``."""
        return Tolerances.uniform(self.atol, self.rtol)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_abstract(cls: type) -> bool:
    """Whether ``cls`` leaves an abstract method unimplemented.

    Computed here because ``ABCMeta`` sets ``__abstractmethods__`` only after
    ``__init_subclass__`` has run.
    """
    names = {name for base in cls.__mro__[1:] for name in getattr(base, "__abstractmethods__", ())}
    names.update(cls.__dict__)
    return any(getattr(getattr(cls, name, None), "__isabstractmethod__", False) for name in names)


def backend_classes() -> list[type[Backend]]:
    """Every live concrete backend class that declares its own ``kind``, in definition order.

    A class defined again under the same name comes after the one it replaces.
    """
    found: list[type[Backend]] = []
    seen: set[type[Backend]] = set()
    stack = list(reversed(Backend.__subclasses__()))
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if "kind" in cls.__dict__ and not _is_abstract(cls):
            found.append(cls)
        stack.extend(reversed(cls.__subclasses__()))
    return found
