"""Input signatures (graph keys), samples and helpers over nested tensor structures.

A *graph* is one input signature of one module: the structure of its positional
and keyword arguments, the dtype and shape of every tensor in it, and the value of
every non-tensor leaf. A module called two ways has two graphs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import InvalidInputError
from ..hf import (
    Derived,
    contains_cache,
    from_data,
    is_cache_object,
    key_value,
    to_data,
)

Args = tuple[Any, ...]
Kwargs = dict[str, Any]

_DTYPE_SHORT = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}


def dtype_name(dtype: torch.dtype) -> str:
    """Short readable dtype name, e.g. ``f32``."""
    return _DTYPE_SHORT.get(dtype, str(dtype).replace("torch.", ""))


MAX_DIM_SIZE = 2**31 - 1
"""Largest axis size a :class:`Dim` may declare (sizes beyond it are not real inputs)."""


@dataclass(frozen=True)
class Dim:
    """A named dynamic axis: every size from ``min`` to ``max`` (inclusive) is served.

    Axes of different inputs that carry the same name always have the same size in one call
    (the batch axis of ``input_ids`` and ``attention_mask``).

    Args:
        name: An identifier; a string elsewhere in ``dynamic_shapes`` reuses it.
        min: The smallest size served.
        max: The largest size served.

    Raises:
        InvalidInputError: The name is not an identifier, or the bounds are not integers with
            ``1 <= min <= max`` (within a bound on sizes).

    Example:
        >>> import tunetree as tt
        >>> batch = tt.Dim("batch", 1, 64)
        >>> batch.accepts(8), batch.accepts(65)
        (True, False)
    """

    name: str
    min: int
    max: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise InvalidInputError(f"a Dim's name must be an identifier, got {self.name!r}")
        for bound in (self.min, self.max):
            if not isinstance(bound, int) or isinstance(bound, bool):
                raise InvalidInputError(f"Dim {self.name!r}: bounds must be integers")
        if not 1 <= self.min <= self.max <= MAX_DIM_SIZE:
            raise InvalidInputError(
                f"Dim {self.name!r}: need 1 <= min <= max <= {MAX_DIM_SIZE}, "
                f"got min={self.min}, max={self.max}"
            )

    def accepts(self, size: int) -> bool:
        """True when ``size`` lies in this range."""
        return self.min <= size <= self.max

    def __str__(self) -> str:
        return f"{self.name} {self.min}..{self.max}"


@dataclass(frozen=True)
class TensorSpec:
    """Dtype and shape of one tensor in a signature; an axis is a fixed size or a :class:`Dim`."""

    dtype: str
    shape: tuple[int | Dim, ...]

    @property
    def is_dynamic(self) -> bool:
        """True when some axis is a :class:`Dim`."""
        return any(isinstance(s, Dim) for s in self.shape)

    def example_shape(self) -> tuple[int, ...]:
        """A concrete shape inside this spec.

        Each :class:`Dim` is at its smallest size above 1 (sizes 0 and 1 are special-cased by
        tracers), within its range.
        """
        return tuple(s if isinstance(s, int) else min(max(s.min, 2), s.max) for s in self.shape)

    def accepts(self, shape: tuple[int, ...], bound: dict[str, int]) -> bool:
        """True when a concrete ``shape`` fits this spec.

        ``bound`` holds the sizes that named dimensions took earlier in the same call and is
        extended here.
        """
        if len(shape) != len(self.shape):
            return False
        for want, got in zip(self.shape, shape, strict=True):
            if isinstance(want, Dim):
                if not want.accepts(got) or bound.setdefault(want.name, got) != got:
                    return False
            elif want != got:
                return False
        return True

    def __str__(self) -> str:
        sep = ", " if self.is_dynamic else ","
        return f"{self.dtype}[{sep.join(str(s) for s in self.shape)}]"


@dataclass(frozen=True)
class RankSpec:
    """A tensor leaf with its sizes left out: what graphs that differ only in sizes share."""

    dtype: str
    rank: int
    one_position: bool = False
    """An integer matrix argument of a call that takes a cache, holding one position per row
    (the token input of a decode step): decode steps and prefills are never one graph, since
    each is served best by its own runner (a replayed capture for the step, ranges for the
    prompt), whatever the cache's state."""


_INTEGER_DTYPES = frozenset({"i64", "i32", "i16", "i8", "u8"})


def _step_marked(sig: Any) -> Any:
    """A top-level argument's pattern in a call that takes a cache (see ``one_position``)."""
    if isinstance(sig, TensorSpec):
        one = len(sig.shape) == 2 and sig.dtype in _INTEGER_DTYPES and sig.shape[-1] == 1
        return RankSpec(sig.dtype, 2, True) if one else _strip_sizes(sig)
    return _strip_sizes(sig)


def _dict_key(key: Any) -> str | int:
    """A dict key as a signature holds it: an int stays an int, anything else is its text.

    A recurrent cache layer keys its states by index, and a call rebuilt from the key must
    find them there.
    """
    return key if type(key) is int else str(key)


def _leaf_signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorSpec(dtype_name(value.dtype), tuple(value.shape))
    if isinstance(value, Derived):  # a cache's int keyed by what it is (tunetree.hf.positions)
        return ("const", "derived", str(value))
    if isinstance(value, enum.Enum):  # a member by its stable name (IntEnums too), not its id
        cls = type(value)
        return ("const", "enum", f"{cls.__module__}.{cls.__qualname__}.{value.name}")
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("const", type(value).__name__, value)
    if isinstance(value, torch.dtype | torch.device):
        return ("const", type(value).__name__, str(value))
    if isinstance(value, torch.Size):  # a shape passed on is a tuple of ints, as recorded
        return ("tuple", tuple(("const", "int", int(v)) for v in value))
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(_leaf_signature(v) for v in value))
    if isinstance(value, Mapping):
        return ("dict", tuple((_dict_key(k), _leaf_signature(v)) for k, v in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = tuple(
            (f.name, _leaf_signature(getattr(value, f.name))) for f in dataclasses.fields(value)
        )
        return (type(value).__qualname__, fields)
    if isinstance(value, type):
        return ("const", "type", f"{value.__module__}.{value.__qualname__}")
    if is_cache_object(value):  # a cache is data: its tensors' shapes, not its identity
        # Ints that repeat a tensor's size, or count positions, are keyed by what they are
        # (tunetree.hf.positions): every decode step and every capacity is not a graph apart.
        fields = vars(value)
        attributes = tuple((k, _leaf_signature(key_value(fields, k))) for k in sorted(fields))
        return ("data", type(value).__qualname__, attributes)
    # Opaque objects (a cache, a config): their contents are invisible here, and a backend
    # that exported the graph may have baked them in as constants. Keying them by identity
    # means a runner only ever serves the very object it was tuned with; any other object
    # takes the original forward.
    return ("object", type(value).__qualname__, id(value))


@dataclass(frozen=True)
class GraphKey:
    """A hashable input signature: structure, dtypes, shapes and constant values."""

    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, args: Args, kwargs: Kwargs) -> GraphKey:
        """Signature of one call."""
        return cls(
            tuple(_leaf_signature(a) for a in args),
            tuple(sorted((k, _leaf_signature(v)) for k, v in kwargs.items())),
        )

    @property
    def has_opaque(self) -> bool:
        """True when an argument is an opaque object, keyed by identity (see ``GraphKey.of``)."""
        return any(_is_opaque(sig) for sig in self.args) or any(
            _is_opaque(sig) for _, sig in self.kwargs
        )

    @property
    def holds_cache(self) -> bool:
        """True when an argument is a cache object: a generation step, called from a loop."""
        return any(_holds_cache(sig) for sig in self.args) or any(
            _holds_cache(sig) for _, sig in self.kwargs
        )

    @property
    def is_dynamic(self) -> bool:
        """True when some tensor axis is a named :class:`Dim` range."""
        return any(spec.is_dynamic for spec in self.tensor_specs())

    def tensor_specs(self) -> list[TensorSpec]:
        """Every tensor leaf's spec, in a fixed order (args first, then kwargs by name)."""
        found: list[TensorSpec] = []
        _collect_specs(self.args, found)
        _collect_specs(self.kwargs, found)
        return found

    def pattern(self) -> GraphKey:
        """This key with every tensor's sizes left out (dtype and rank kept).

        Calls whose keys share a pattern differ only in sizes. In a call that takes a cache, a
        token matrix of one position per row is kept apart (:attr:`RankSpec.one_position`).
        """
        if not self.holds_cache:
            return GraphKey(_strip_sizes(self.args), _strip_sizes(self.kwargs))
        return GraphKey(
            tuple(_step_marked(a) for a in self.args),
            tuple((k, _step_marked(v)) for k, v in self.kwargs),
        )

    def accepts(self, exact: GraphKey) -> bool:
        """True when a call with the exact key ``exact`` falls inside this key's ranges.

        The two keys must share a :meth:`pattern` (the caller looks them up by it).
        """
        ours, theirs = self.tensor_specs(), exact.tensor_specs()
        if len(ours) != len(theirs):
            return False
        bound: dict[str, int] = {}
        return all(
            o.dtype == t.dtype and o.accepts(t.shape, bound)  # type: ignore[arg-type]
            for o, t in zip(ours, theirs, strict=True)
        )

    def covers(self, other: GraphKey) -> bool:
        """True when every call ``other`` accepts is accepted by this key too.

        ``other`` may be exact or ranged. Used to serve a narrower range (or one shape) with
        a runner tuned for a wider one. The keys must share a :meth:`pattern`.
        """
        if self.pattern() != other.pattern():
            return False
        taken: dict[str, int | str] = {}
        for ours, theirs in zip(self.tensor_specs(), other.tensor_specs(), strict=True):
            for want, got in zip(ours.shape, theirs.shape, strict=True):
                if not isinstance(want, Dim):
                    if want != got:
                        return False
                    continue
                low, high = (got, got) if isinstance(got, int) else (got.min, got.max)
                seen = got if isinstance(got, int) else got.name
                if not (want.min <= low and high <= want.max):
                    return False
                if taken.setdefault(want.name, seen) != seen:
                    return False  # one of our names, two independent sizes of theirs
        return True

    def dims(self) -> dict[str, Dim]:
        """The named dynamic dimensions of this key, by name."""
        return {
            size.name: size
            for spec in self.tensor_specs()
            for size in spec.shape
            if isinstance(size, Dim)
        }

    def digest(self) -> str:
        """Stable 16-hex-digit id of this signature (the same in every process)."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        """This signature as JSON data; :meth:`from_json` restores an equal key.

        Tuples become lists and a :class:`TensorSpec` a ``{"dtype", "shape"}`` object.
        """
        return {"args": _sig_to_json(self.args), "kwargs": _sig_to_json(self.kwargs)}

    @classmethod
    def from_json(cls, data: Any) -> GraphKey:
        """The key that :meth:`to_json` described.

        Raises ValueError for anything else, so a damaged checkpoint or cache entry is refused
        instead of never matching a call.
        """
        if not isinstance(data, dict) or set(data) != {"args", "kwargs"}:
            raise ValueError("a graph key is an object with exactly 'args' and 'kwargs'")
        args, kwargs = _sig_from_json(data["args"]), _sig_from_json(data["kwargs"])
        if not isinstance(args, tuple) or not isinstance(kwargs, tuple):
            raise ValueError("graph key 'args' and 'kwargs' must be lists")
        if not all(
            isinstance(kw, tuple) and len(kw) == 2 and isinstance(kw[0], str) for kw in kwargs
        ):
            raise ValueError("graph key 'kwargs' must be a list of [name, signature] pairs")
        return cls(args, kwargs)

    def __str__(self) -> str:
        parts = [_format_sig(a) for a in self.args]
        parts += [
            f"{k}={_format_sig(v)}" for k, v in self.kwargs if v != ("const", "NoneType", None)
        ]
        return "(" + ", ".join(parts) + ")"


def _sig_to_json(sig: Any) -> Any:
    if isinstance(sig, TensorSpec):
        return {"dtype": sig.dtype, "shape": [_size_to_json(n) for n in sig.shape]}
    if isinstance(sig, tuple):
        return [_sig_to_json(s) for s in sig]
    if sig is None or isinstance(sig, bool | int | float | str):
        return sig
    raise ValueError(f"a graph signature cannot hold a {type(sig).__name__}")


def _sig_from_json(data: Any) -> Any:
    if isinstance(data, dict):
        dtype, shape = data.get("dtype"), data.get("shape")
        if (
            set(data) != {"dtype", "shape"}
            or not isinstance(dtype, str)
            or not isinstance(shape, list)
        ):
            raise ValueError(f"not a tensor signature: {data!r}")
        return TensorSpec(dtype, tuple(_size_from_json(n) for n in shape))
    if isinstance(data, list):
        return tuple(_sig_from_json(d) for d in data)
    if data is None or isinstance(data, bool | int | float | str):
        return data
    raise ValueError(f"a graph signature cannot hold a {type(data).__name__}")


def _size_to_json(size: int | Dim) -> Any:
    if isinstance(size, Dim):
        return {"dim": size.name, "min": size.min, "max": size.max}
    return size


def _size_from_json(data: Any) -> int | Dim:
    if isinstance(data, int) and not isinstance(data, bool):
        if not 0 <= data <= MAX_DIM_SIZE:
            raise ValueError(f"axis size {data} is out of range")
        return data
    if isinstance(data, dict) and set(data) == {"dim", "min", "max"}:
        try:
            return Dim(data["dim"], data["min"], data["max"])
        except InvalidInputError as exc:
            raise ValueError(str(exc)) from None
    raise ValueError(
        f"not a tensor signature: an axis is a size or a {{dim, min, max}} range, not {data!r}"
    )


def _collect_specs(sig: Any, found: list[TensorSpec]) -> None:
    if isinstance(sig, TensorSpec):
        found.append(sig)
    elif isinstance(sig, tuple) and not (len(sig) == 3 and sig[0] in ("const", "object")):
        for part in sig:
            _collect_specs(part, found)


def _strip_sizes(sig: Any) -> Any:
    if isinstance(sig, TensorSpec):
        return RankSpec(sig.dtype, len(sig.shape))
    if isinstance(sig, tuple) and not (len(sig) == 3 and sig[0] in ("const", "object")):
        return tuple(_strip_sizes(part) for part in sig)
    return sig


def _holds_cache(sig: Any) -> bool:
    """True when a leaf signature is, or contains, a cache object's (``("data", ...)``)."""
    if isinstance(sig, TensorSpec) or not isinstance(sig, tuple):
        return False
    if len(sig) == 3 and sig[0] in ("data", "const", "object"):
        return sig[0] == "data"
    return any(_holds_cache(part) for part in sig)


def _is_opaque(sig: Any) -> bool:
    """True when a leaf signature is, or contains, an identity-keyed opaque object.

    Such an object is ``("object", type name, id)``; constants are ``("const", type name, value)``.
    """
    if isinstance(sig, TensorSpec) or not isinstance(sig, tuple):
        return False
    if len(sig) == 3 and sig[0] == "object" and isinstance(sig[2], int):
        return True
    if len(sig) == 3 and sig[0] == "const":
        return False
    return any(_is_opaque(part) for part in sig)


def _format_sig(sig: Any) -> str:
    if isinstance(sig, TensorSpec):
        return str(sig)
    if isinstance(sig, tuple) and sig and sig[0] == "const":
        return repr(sig[2])
    if isinstance(sig, tuple) and len(sig) == 2 and sig[0] in ("tuple", "list"):
        inner = ", ".join(_format_sig(s) for s in sig[1])
        return f"({inner})" if sig[0] == "tuple" else f"[{inner}]"
    if isinstance(sig, tuple) and len(sig) == 2 and sig[0] == "dict":
        return "{" + ", ".join(f"{k}: {_format_sig(v)}" for k, v in sig[1]) + "}"
    if isinstance(sig, tuple) and len(sig) == 3 and sig[0] == "object":
        return f"<{sig[1].rsplit('.', 1)[-1]}>"
    if isinstance(sig, tuple) and len(sig) == 3 and sig[0] == "data":
        specs: list[TensorSpec] = []
        _collect_specs(sig[2], specs)
        shown = ", ".join(str(s) for s in specs[:2]) + (", ..." if len(specs) > 2 else "")
        return f"{sig[1]}({len(specs)} tensors: {shown})"
    if isinstance(sig, tuple) and len(sig) == 2:
        return f"{sig[0]}(...)"
    return repr(sig)


@dataclass
class Sample:
    """One call of a module: positional and keyword arguments."""

    args: Args
    kwargs: Kwargs = field(default_factory=dict)

    _stateful: bool | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def key(self) -> GraphKey:
        """The graph key of this call."""
        return GraphKey.of(self.args, self.kwargs)

    @property
    def stateful(self) -> bool:
        """True when the call holds state its callee mutates (a cache object)."""
        if self._stateful is None:
            self._stateful = contains_cache((self.args, self.kwargs))
        return self._stateful

    def run(self, fn: Callable[..., Any]) -> Any:
        """``fn`` called with this sample's arguments.

        A stateful call gets a copy of its state each time, so no run sees another's mutation
        (a decode step appends to the cache it is given).
        """
        own = self.own()
        return fn(*own.args, **own.kwargs)

    def own(self) -> Sample:
        """This sample, or for a stateful one a copy: a call on it leaves this one's state as is."""
        if not self.stateful:
            return self
        return Sample(*detach_clone((self.args, self.kwargs)))

    def to(self, device: torch.device | str) -> Sample:
        """A copy with every tensor moved to ``device``."""
        return Sample(to_device(self.args, device), to_device(self.kwargs, device))


@dataclass
class Graph:
    """One input signature of one module, with the samples recorded for it and eager's outputs."""

    key: GraphKey
    samples: list[Sample]
    outputs: list[Any]
    probes: list[Sample] = field(default_factory=list, repr=False)
    """Calls recorded only to find the ranges (the root run at declared range ends): they
    widen the key's ranges but are not part of the measured workload."""
    checks: list[tuple[str, Any, Any]] | None = field(default=None, repr=False, compare=False)
    """Probe calls with eager's outputs, built once per graph by the evaluator (cached) and
    parked in host memory: read them with :func:`tunetree.signature.probes.checks`."""
    described: list[GraphKey] = field(default_factory=list, repr=False, compare=False)
    """Exact signatures of calls recorded without a copy (their sizes widen the ranges)."""
    calls: int = 0
    """Calls of this graph during the inspection (copied or not); 0 when not counted."""
    total_s: float = 0.0
    """Their eager seconds during the inspection: where a tuning budget should go first."""
    output_homes: list[tuple[torch.device | None, ...] | None] | None = field(
        default=None, repr=False, compare=False
    )
    """Set when eager's outputs wait in host memory (:mod:`tunetree.signature.parking`): for
    each output, where its tensors go back. Read them with ``parking.reference``."""

    def __str__(self) -> str:
        return str(self.key)


def with_own_state(graph: Graph) -> Graph:
    """``graph`` for a backend's build: its stateful samples are copies (the others are shared).

    A build may run the module on the samples it is given (an exporter tracing them), and a call
    appends to the cache it is given: on the graph's own samples, a build (failed or not) would
    change what eager's reference and the next candidates see. ``graph`` itself when no sample
    holds state.
    """
    if not any(sample.stateful for sample in graph.samples):
        return graph
    return dataclasses.replace(graph, samples=[sample.own() for sample in graph.samples])


def resize_axis(tensor: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    """``tensor`` with ``axis`` at ``size``: sliced when smaller, tiled when larger.

    So the values stay ones the model saw (token ids in the vocabulary, masks with real rows).
    """
    have = int(tensor.shape[axis])
    if size <= have:
        return tensor.narrow(axis, 0, size)
    repeats = math.ceil(size / max(have, 1))
    return torch.cat([tensor] * repeats, dim=axis).narrow(axis, 0, size)


def as_sample(item: Any) -> Sample:
    """Turn a dataset item into a call.

    A tensor is one positional argument, a tuple or list are positional arguments, a dict holds
    keyword arguments (Hugging Face style).
    """
    if isinstance(item, Sample):
        return item
    if isinstance(item, torch.Tensor):
        return Sample((item,), {})
    if isinstance(item, tuple | list):
        return Sample(tuple(item), {})
    if isinstance(item, Mapping):
        if not all(isinstance(k, str) for k in item):
            raise InvalidInputError("a dict dataset item must have string keys (keyword arguments)")
        return Sample((), dict(item))
    raise InvalidInputError(
        f"cannot call a model with a dataset item of type {type(item).__name__}: "
        "give a tensor, a tuple/list of positional arguments, or a dict of keyword arguments"
    )


def as_samples(dataset: Iterable[Any]) -> list[Sample]:
    """Every dataset item as a :class:`Sample`; refuses an empty dataset."""
    if isinstance(dataset, torch.Tensor | Mapping):
        raise InvalidInputError(
            "the dataset is a list of model inputs; wrap a single input in a list: [x]"
        )
    samples = [as_sample(item) for item in dataset]
    if not samples:
        raise InvalidInputError("the dataset is empty: give at least one real model input")
    return samples


def map_tensors(fn: Callable[[torch.Tensor], Any], tree: Any) -> Any:
    """Apply ``fn`` to every tensor in a nested structure, keeping structure and container types.

    Nested structures are tuples, lists, dicts, dataclasses and Hugging Face ``ModelOutput``.
    """
    _register_dataclasses(tree)
    return from_data(pytree.tree_map_only(torch.Tensor, fn, to_data(tree)))


def to_device(tree: Any, device: torch.device | str) -> Any:
    """A copy of ``tree`` with every tensor on ``device``."""
    return map_tensors(lambda t: t.to(device), tree)


def detach_clone(tree: Any) -> Any:
    """A copy of ``tree`` whose tensors own their memory and carry no autograd history."""
    return map_tensors(lambda t: t.detach().clone(), tree)


def _register_dataclasses(tree: Any) -> None:
    """Teach torch's pytree about plain dataclass outputs met in ``tree``.

    Hugging Face ``ModelOutput`` and the builtin containers are known to it already. The dataclasses
    are then flattened into their fields instead of being treated as opaque leaves.
    """
    if isinstance(tree, torch.Tensor) or tree is None:
        return
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        cls = type(tree)
        if cls not in pytree.SUPPORTED_NODES and not isinstance(tree, Mapping):
            # ValueError: registered meanwhile; TypeError: not constructible from its fields.
            with contextlib.suppress(ValueError, TypeError):
                pytree.register_dataclass(cls)
        for f in dataclasses.fields(tree):
            _register_dataclasses(getattr(tree, f.name, None))
    elif isinstance(tree, tuple | list):
        for item in tree:
            _register_dataclasses(item)
    elif isinstance(tree, Mapping):
        for item in tree.values():
            _register_dataclasses(item)


def flatten(tree: Any) -> tuple[list[Any], pytree.TreeSpec]:
    """Leaves and structure of a nested output, for backends that return flat lists.

    Cache objects are data (:mod:`tunetree.hf.caches`): their tensors are leaves.
    """
    _register_dataclasses(tree)
    return pytree.tree_flatten(to_data(tree))


def unflatten(leaves: list[Any], spec: pytree.TreeSpec) -> Any:
    """Rebuild a nested output (same container types, new cache objects) from its leaves."""
    return from_data(pytree.tree_unflatten(leaves, spec))


def batch_size(sample: Sample) -> int:
    """Size of the leading axis of the first tensor in a sample (1 when it has none)."""
    leaves, _ = flatten((sample.args, sample.kwargs))
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return 1
