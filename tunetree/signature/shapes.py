"""Shapes that vary: dynamic dimensions, inferred or declared, and samples resized along them.

Dynamic dimensions are inferred from recorded calls or declared by the user; samples are resized
along them for probes at a range's ends and re-batched datasets.

A graph's key holds, per tensor axis, a fixed size or a named :class:`~.graph.Dim`. Calls
whose keys share a :meth:`~.graph.GraphKey.pattern` (structure, dtypes, ranks, constants)
belong to one graph; an axis whose size varies across them becomes a ``Dim`` whose range is
what was seen, and axes that always vary together share its name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..errors import InvalidInputError
from ..hf import ObjectState, from_data, to_data
from .graph import Dim, Graph, GraphKey, Sample, TensorSpec, as_samples, resize_axis
from .parking import park_outputs
from .windows import (
    carried_floors,
    filled_windows,
    lowered_to_floor,
    raised_to_ceiling,
    window_ceilings,
)

AxisRef = tuple[int, int]
"""(index of a tensor leaf in :meth:`GraphKey.tensor_specs` order, axis)."""

DynamicShapes = Any
"""What ``dynamic_shapes=`` takes: ``None`` (infer from the samples), ``False`` (exact shapes
only), or a torch.export-style nest mirroring the call's inputs: a dict keyed by keyword (or
positional parameter name, or positional index), a tuple/list for positional arguments,
and per tensor a dict ``{axis: Dim | name}`` or a tuple with ``None`` for fixed axes."""


# --------------------------------------------------------------------------- tensor leaves


def tensor_locations(sample: Sample) -> list[tuple[Any, ...]]:
    """Where each tensor of a call sits, in the order of :meth:`GraphKey.tensor_specs`.

    For example ``("args", 0)``, ``("kwargs", "input_ids")``, deeper paths for nested inputs.
    """
    found: list[tuple[Any, ...]] = []
    args, kwargs = to_data((sample.args, sample.kwargs))
    for i, arg in enumerate(args):
        _walk(arg, ("args", i), found)
    for name in sorted(kwargs):
        _walk(kwargs[name], ("kwargs", name), found)
    return found


def _walk(value: Any, where: tuple[Any, ...], found: list[tuple[Any, ...]]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(where)
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            _walk(item, (*where, i), found)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _walk(item, (*where, str(key)), found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _walk(getattr(value, f.name), (*where, f.name), found)
    elif isinstance(value, ObjectState):  # a cache: its data attributes, in their order
        for name, item in value.data.items():
            _walk(item, (*where, name), found)


def map_leaves(sample: Sample, fn: Callable[[int, torch.Tensor], torch.Tensor]) -> Sample:
    """A copy of ``sample`` whose ``i``-th tensor (``tensor_specs`` order) is ``fn(i, t)``."""
    counter = iter(range(1 << 30))
    order = {where: next(counter) for where in tensor_locations(sample)}
    state_args, state_kwargs = to_data((sample.args, sample.kwargs))
    args = tuple(_rebuild(a, ("args", i), order, fn) for i, a in enumerate(state_args))
    kwargs = {k: _rebuild(v, ("kwargs", k), order, fn) for k, v in state_kwargs.items()}
    return Sample(from_data(args), from_data(kwargs))


def _rebuild(
    value: Any,
    where: tuple[Any, ...],
    order: Mapping[tuple[Any, ...], int],
    fn: Callable[[int, torch.Tensor], torch.Tensor],
) -> Any:
    """``value`` with each tensor ``t`` at location ``where`` replaced by ``fn(order[where], t)``.

    Module-level (a nested function calling itself is a reference cycle that keeps what it
    holds alive until the cyclic garbage collector runs).
    """
    if isinstance(value, torch.Tensor):
        return fn(order[where], value)
    if isinstance(value, tuple | list):
        items = [_rebuild(v, (*where, i), order, fn) for i, v in enumerate(value)]
        return type(value)(items) if isinstance(value, list) else tuple(items)
    if isinstance(value, Mapping):
        return {k: _rebuild(v, (*where, str(k)), order, fn) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: _rebuild(getattr(value, f.name), (*where, f.name), order, fn)
            for f in dataclasses.fields(value)
        }
        return dataclasses.replace(value, **changes)
    if isinstance(value, ObjectState):
        data = {k: _rebuild(v, (*where, k), order, fn) for k, v in value.data.items()}
        return value.with_data(data)
    return value


# --------------------------------------------------------------------------- inference


@dataclasses.dataclass(frozen=True)
class RootDim:
    """A dimension of the root's graphs and the size it took in each root call.

    A submodule axis whose size equals this dimension's in every root call it was recorded in
    *follows* it: it serves the root's whole range, not only the sizes its own pattern saw
    (:func:`ranged_key`).
    """

    dim: Dim
    sizes: Mapping[int, int]
    """Root call index -> the size this dimension took in that call."""

    def followed_by(self, sizes: Sequence[int], origins: Sequence[int]) -> bool:
        """Whether an axis of these ``sizes``, recorded in root calls ``origins``, follows it."""
        return bool(origins) and all(
            self.sizes.get(origin) == size for origin, size in zip(origins, sizes, strict=True)
        )


def ranged_key(
    keys: Sequence[GraphKey],
    declared: Mapping[AxisRef, Dim] | None = None,
    known: Iterable[tuple[frozenset[int], str]] = (),
    *,
    followed: Sequence[RootDim] = (),
    origins: Sequence[int] = (),
    filled: Collection[int] = (),
) -> GraphKey:
    """The key of one graph serving every exact key in ``keys`` (which share a pattern).

    An axis whose size varies across ``keys`` becomes a :class:`Dim` spanning the sizes
    seen; axes with identical size sequences share one name. ``declared`` fixes the
    ``Dim`` of given axes (a size seen outside it is refused); ``known`` lends names of
    dimensions seen elsewhere (e.g. the root's ``batch``) to axes with the same set of sizes.

    ``origins`` gives, for the first ``len(origins)`` keys, the root call each was recorded
    in; an axis that follows one of the root's dimensions (``followed``) call for call takes
    that dimension's name and its whole range. A submodule that the root calls in two ways
    (a Llama layer gets no mask for an unpadded batch of 1 and a mask for padded batches)
    then serves every size the root serves, not only the sizes its own pattern happened to
    see: its candidates are checked on probes at the widened range's ends like any other.

    ``filled`` are the sliding windows that some recorded call of the module had filled: the
    keys of such a window below it reach up to ``window - 1`` (:mod:`.windows`).
    """
    if not keys:
        raise ValueError("ranged_key needs at least one key")
    specs = [key.tensor_specs() for key in keys]
    first = specs[0]
    declared = dict(declared or {})
    _check_declared(specs, declared)
    groups: dict[tuple[int, ...], list[AxisRef]] = {}
    for leaf, spec in enumerate(first):
        for axis in range(len(spec.shape)):
            if (leaf, axis) in declared:
                continue
            sizes = tuple(int(s[leaf].shape[axis]) for s in specs)  # type: ignore[arg-type]
            if len(set(sizes)) > 1:
                groups.setdefault(sizes, []).append((leaf, axis))
    dims = dict(declared)
    taken = {d.name for d in declared.values()}
    known_names = dict(known)
    lowered = lowered_to_floor(groups, carried_floors(keys[0]))
    raised = raised_to_ceiling(groups, window_ceilings(keys[0], filled))
    for sizes, refs in groups.items():
        root = next(
            (
                r
                for r in followed
                if r.dim.name not in taken and r.followed_by(sizes[: len(origins)], origins)
            ),
            None,
        )
        if root is not None:
            name = root.dim.name
            low, high = min(root.dim.min, *sizes), max(root.dim.max, *sizes)
        else:
            name = known_names.get(frozenset(sizes)) or ""
            if not name or name in taken:
                name = _fresh_name(refs, taken)
            low, high = min(sizes), max(sizes)
            low = max(low - lowered.get(sizes, 0), min(low, 1))
            high += raised.get(sizes, 0)
        taken.add(name)
        dim = Dim(name, low, high)
        for ref in refs:
            dims[ref] = dim
    return _with_dims(keys[0], dims)


def _check_declared(specs: list[list[TensorSpec]], declared: Mapping[AxisRef, Dim]) -> None:
    by_name: dict[str, Dim] = {}
    for (leaf, axis), dim in declared.items():
        if by_name.setdefault(dim.name, dim) != dim:
            raise InvalidInputError(f"dimension {dim.name!r} is declared with two ranges")
        for spec in specs:
            if leaf >= len(spec) or axis >= len(spec[leaf].shape):
                raise InvalidInputError(f"dimension {dim.name!r} names an axis the input lacks")
            size = spec[leaf].shape[axis]
            if isinstance(size, int) and not dim.accepts(size):
                raise InvalidInputError(
                    f"a recorded input has size {size}, outside the declared {dim}: "
                    "widen the Dim or leave that input out"
                )


def _fresh_name(refs: list[AxisRef], taken: set[str]) -> str:
    axes = {axis for _, axis in refs}
    base = "batch" if 0 in axes else "seq" if 1 in axes else "dim"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}{n}", n + 1
    return name


def _with_dims(key: GraphKey, dims: Mapping[AxisRef, Dim]) -> GraphKey:
    counter = iter(range(1 << 30))
    return GraphKey(_swap_dims(key.args, dims, counter), _swap_dims(key.kwargs, dims, counter))


def _swap_dims(sig: Any, dims: Mapping[AxisRef, Dim], counter: Iterator[int]) -> Any:
    """``sig`` with the sizes named in ``dims`` swapped in, tensors numbered by ``counter``."""
    if isinstance(sig, TensorSpec):
        leaf = next(counter)
        shape = tuple(dims.get((leaf, axis), size) for axis, size in enumerate(sig.shape))
        return TensorSpec(sig.dtype, shape)
    if isinstance(sig, tuple) and not (len(sig) == 3 and sig[0] in ("const", "object")):
        return tuple(_swap_dims(part, dims, counter) for part in sig)
    return sig


def group_graphs(
    calls: Sequence[tuple[Sample, Any]],
    *,
    dynamic: bool = True,
    declared: Mapping[AxisRef, Dim] | None = None,
    known: Iterable[tuple[frozenset[int], str]] = (),
    probes: Sequence[tuple[Sample, Any]] = (),
    followed: Sequence[RootDim] = (),
    origins: Sequence[int] = (),
    described: Iterable[GraphKey] = (),
    stats: Mapping[GraphKey, tuple[int, float]] | None = None,
) -> dict[GraphKey, Graph]:
    """Group recorded ``(sample, eager output)`` calls of one module into graphs.

    With ``dynamic`` calls that differ only in sizes share a graph whose key has ranges
    (:func:`ranged_key`); without it every exact signature is its own graph.
    ``declared`` applies to every group (the root's declared dimensions). ``probes`` are
    calls made only to find ranges: they widen the ranges of the graph whose pattern they
    share and land in its ``probes``, never in its samples (a probe of no recorded
    pattern is dropped). ``described`` are exact signatures of calls recorded without a copy
    (:mod:`.recording`): they widen the ranges of the graph of their pattern too (with
    ``dynamic``; else they are dropped, as is one of a pattern with no sample). ``stats``
    gives each exact signature's calls and eager seconds, summed into each graph's.
    ``origins`` (the root call of each of ``calls``) and ``followed`` (the root's dimensions)
    let an axis that follows a root dimension take its whole range (:func:`ranged_key`).
    """
    groups: dict[GraphKey, list[tuple[Sample, Any]]] = {}
    group_origins: dict[GraphKey, list[int]] = {}
    for i, (sample, output) in enumerate(calls):
        exact = sample.key
        group = exact.pattern() if dynamic else exact
        groups.setdefault(group, []).append((sample, output))
        if len(origins) == len(calls):
            group_origins.setdefault(group, []).append(origins[i])
    extra: dict[GraphKey, list[Sample]] = {}
    shapes_only: dict[GraphKey, list[GraphKey]] = {}
    if dynamic:
        for sample, _ in probes:
            pattern = sample.key.pattern()
            if pattern in groups:
                extra.setdefault(pattern, []).append(sample)
        for exact in described:
            pattern = exact.pattern()
            if pattern in groups:
                shapes_only.setdefault(pattern, []).append(exact)
    totals: dict[GraphKey, tuple[int, float]] = {}
    for exact, (count, seconds) in (stats or {}).items():
        group = exact.pattern() if dynamic else exact
        before = totals.get(group, (0, 0.0))
        totals[group] = (before[0] + count, before[1] + seconds)
    known = list(known)
    # the windows some call of the module went past (its sliding windows' keys reach up)
    seen = [s.key for s, _ in calls] + [k for keys in shapes_only.values() for k in keys]
    filled = filled_windows(seen)
    graphs: dict[GraphKey, Graph] = {}
    for group, members in groups.items():
        described_keys = list(dict.fromkeys(shapes_only.get(group, [])))
        exact_keys = (
            [s.key for s, _ in members] + [p.key for p in extra.get(group, [])] + described_keys
        )
        key = (
            ranged_key(
                exact_keys,
                declared,
                known,
                followed=followed,
                origins=group_origins.get(group, []),
                filled=filled,
            )
            if dynamic
            else exact_keys[0]
        )
        count, seconds = totals.get(group, (len(members), 0.0))
        graph = Graph(
            key,
            [s for s, _ in members],
            [o for _, o in members],
            extra.get(group, []),
            described=described_keys,
            calls=int(count),
            total_s=seconds,
        )
        park_outputs(graph)  # eager's outputs wait in host memory until a candidate is judged
        graphs[key] = graph
    return graphs


def root_dims(graph: Graph, origins: Sequence[int]) -> list[RootDim]:
    """Each named dimension of a root graph with its size per root call.

    ``origins`` is the root call index of each of ``graph.samples``.
    """
    by_name: dict[str, dict[int, int]] = {}
    for origin, sample in zip(origins, graph.samples, strict=True):
        for name, size in sizes_of(sample, graph.key).items():
            by_name.setdefault(name, {})[origin] = size
    dims = graph.key.dims()
    return [RootDim(dims[name], sizes) for name, sizes in by_name.items() if name in dims]


def dim_sizes(graph: Graph) -> list[tuple[frozenset[int], str]]:
    """For each named dimension of ``graph``'s key, the sizes it took over the samples and probes.

    This is what :func:`group_graphs` takes as ``known`` to lend the name.
    """
    seen: dict[str, set[int]] = {}
    exact = [s.key for s in [*graph.samples, *graph.probes]] + list(graph.described)
    for key in exact:
        for name, size in key_sizes(key, graph.key).items():
            seen.setdefault(name, set()).add(size)
    return [(frozenset(sizes), name) for name, sizes in seen.items()]


# --------------------------------------------------------------------------- declared dims


def declared_axes(
    spec: DynamicShapes, sample: Sample, parameters: Sequence[str] = ()
) -> dict[AxisRef, Dim]:
    """Resolve a torch.export-style ``dynamic_shapes`` nest against one call of the root.

    ``parameters`` are the forward's parameter names, so a positional argument may be
    named as in torch.export. String values name a ``Dim`` declared elsewhere in the nest.
    """
    locations = {where: i for i, where in enumerate(tensor_locations(sample))}
    raw: dict[AxisRef, Dim | str] = {}
    if isinstance(spec, Mapping):
        for name, inner in spec.items():
            _declare(inner, _top_location(name, sample, parameters), locations, raw)
    elif isinstance(spec, tuple | list):
        for i, inner in enumerate(spec):
            _declare(inner, ("args", i), locations, raw)
    else:
        raise InvalidInputError(
            "dynamic_shapes must be None, False, or a dict/tuple mirroring the inputs, "
            f"not {type(spec).__name__}"
        )
    named = {d.name: d for d in raw.values() if isinstance(d, Dim)}
    resolved: dict[AxisRef, Dim] = {}
    for ref, dim in raw.items():
        if isinstance(dim, str):
            if dim not in named:
                raise InvalidInputError(f"dynamic_shapes names {dim!r}, which no tt.Dim declares")
            dim = named[dim]
        resolved[ref] = dim
    return resolved


def _top_location(name: Any, sample: Sample, parameters: Sequence[str]) -> tuple[Any, ...]:
    if isinstance(name, int) and not isinstance(name, bool):
        return ("args", name)
    if name in sample.kwargs:
        return ("kwargs", name)
    if name in parameters and list(parameters).index(name) < len(sample.args):
        return ("args", list(parameters).index(name))
    raise InvalidInputError(f"dynamic_shapes names input {name!r}, which the call does not have")


def _declare(
    inner: Any,
    where: tuple[Any, ...],
    locations: Mapping[tuple[Any, ...], int],
    out: dict[AxisRef, Dim | str],
) -> None:
    if inner is None:
        return
    if where in locations:
        axes: Iterable[tuple[int, Any]]
        if isinstance(inner, Mapping):
            axes = inner.items()
        elif isinstance(inner, tuple | list):
            axes = enumerate(inner)
        else:
            raise InvalidInputError(f"dynamic_shapes for {where[1:]!r}: give {{axis: tt.Dim}}")
        for axis, dim in axes:
            if dim is None:
                continue
            if not isinstance(dim, Dim | str) or not isinstance(axis, int):
                raise InvalidInputError(
                    f"dynamic_shapes for {where[1:]!r}: {axis!r} -> {dim!r} is not "
                    "axis -> tt.Dim or name"
                )
            out[(locations[where], axis)] = dim
        return
    if isinstance(inner, Mapping):
        for key, value in inner.items():
            _declare(value, (*where, key if isinstance(key, int) else str(key)), locations, out)
    elif isinstance(inner, tuple | list):
        for i, value in enumerate(inner):
            _declare(value, (*where, i), locations, out)
    else:
        raise InvalidInputError(f"dynamic_shapes names {where[1:]!r}, which is not a tensor input")


# --------------------------------------------------------------------------- resizing


def resize(sample: Sample, key: GraphKey, sizes: Mapping[str, int]) -> Sample:
    """A copy of ``sample`` with every axis of dimension ``name`` resized to ``sizes[name]``.

    ``sample`` is a call inside ``key``'s ranges. Axes are sliced when smaller, tiled when larger,
    so values stay ones the model really saw (token ids in the vocabulary, masks with real rows).
    """
    specs = key.tensor_specs()

    def one(leaf: int, tensor: torch.Tensor) -> torch.Tensor:
        for axis, size in enumerate(specs[leaf].shape):
            if isinstance(size, Dim) and size.name in sizes:
                tensor = resize_axis(tensor, axis, sizes[size.name])
        return tensor.clone()

    return map_leaves(sample, one)


def probe_sizes(key: GraphKey) -> list[dict[str, int]]:
    """Sizes to check a ranged graph at, without repeats.

    Every dimension at its minimum, at its maximum, and at an odd size in between (a prime where one
    exists).
    """
    dims = key.dims()
    if not dims:
        return []
    choices = [
        {n: d.min for n, d in dims.items()},
        {n: d.max for n, d in dims.items()},
        {n: _odd_between(d.min, d.max) for n, d in dims.items()},
    ]
    unique: list[dict[str, int]] = []
    for choice in choices:
        if choice not in unique:
            unique.append(choice)
    return unique


def linked_dims(samples: Sequence[Sample], key: GraphKey) -> dict[str, tuple[str, int]]:
    """Dimensions whose size is another's plus a fixed offset in every recorded call.

    ``{b: (a, k)}`` says ``b == a + k`` held in every call, with ``a`` at three sizes or more: a
    decode step's attention mask is one longer than its key/value cache. Probes keep such
    relations, since a call that breaks one is not an input the model serves.
    """
    seen = [sizes_of(s, key) for s in samples]
    names = sorted(key.dims())
    linked: dict[str, tuple[str, int]] = {}
    for i, a in enumerate(names):
        # Three sizes at least: two calls show any two varying sizes at one offset by chance.
        if a in linked or len({sizes[a] for sizes in seen}) < 3:
            continue
        for b in names[i + 1 :]:
            offsets = {sizes[b] - sizes[a] for sizes in seen}
            if b not in linked and len(offsets) == 1:
                linked[b] = (a, offsets.pop())
    return linked


def keep_links(
    choices: Sequence[dict[str, int]], key: GraphKey, linked: Mapping[str, tuple[str, int]]
) -> list[dict[str, int]]:
    """``choices`` with each linked dimension following its base; those then out of range go."""
    dims = key.dims()
    kept: list[dict[str, int]] = []
    for choice in choices:
        fixed = dict(choice)
        for name, (base, offset) in linked.items():
            fixed[name] = fixed[base] + offset
        if all(dims[n].accepts(v) for n, v in fixed.items()) and fixed not in kept:
            kept.append(fixed)
    return kept


def _odd_between(low: int, high: int) -> int:
    """A prime strictly between ``low`` and ``high`` near their middle, else an odd size."""
    middle = (low + high) // 2
    for offset in range(0, min(high - low, 1000)):
        for n in (middle + offset, middle - offset):
            if low < n < high and _is_prime(n):
                return n
    return middle | 1 if low < (middle | 1) < high else middle


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % p for p in range(2, math.isqrt(n) + 1))


def sizes_of(sample: Sample, key: GraphKey) -> dict[str, int]:
    """The size each named dimension of ``key`` takes in ``sample``."""
    return key_sizes(sample.key, key)


def key_sizes(exact_key: GraphKey, key: GraphKey) -> dict[str, int]:
    """The size each named dimension of ``key`` takes in the exact signature ``exact_key``."""
    sizes: dict[str, int] = {}
    exact = exact_key.tensor_specs()
    for spec, got in zip(key.tensor_specs(), exact, strict=True):
        for size, n in zip(spec.shape, got.shape, strict=True):
            if isinstance(size, Dim):
                sizes[size.name] = int(n)  # type: ignore[arg-type]
    return sizes


def largest(samples: Sequence[Sample]) -> Sample:
    """The sample holding the most tensor elements (the best base to resize from)."""
    return max(samples, key=lambda s: sum(int(t.numel()) for t in _tensors(s)))


def _tensors(sample: Sample) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def keep(_: int, tensor: torch.Tensor) -> torch.Tensor:
        found.append(tensor)
        return tensor

    map_leaves(sample, keep)
    return found


# --------------------------------------------------------------------------- re-batching


def batch_axis_leaves(sample: Sample) -> list[int]:
    """Tensor leaves (``tensor_specs`` order) whose axis 0 is the batch.

    Those whose leading size equals the first tensor's.
    """
    tensors = _tensors(sample)
    leading = next((t.shape[0] for t in tensors if t.dim() > 0), None)
    return [i for i, t in enumerate(tensors) if t.dim() > 0 and t.shape[0] == leading]


def rebatch(dataset: Iterable[Any], batch_sizes: Sequence[int]) -> list[Sample]:
    """Every dataset item re-batched to each of ``batch_sizes`` along its batch axis.

    The batch axis is axis 0 of every tensor whose leading size is the first tensor's; rows are
    sliced or repeated. For a user with one real input who will serve several batch sizes:
    ``tt.auto_tune(model, tt.rebatch([x], [1, 8, 32]))``.

    Args:
        dataset: Items as :func:`tunetree.inspect` takes them.
        batch_sizes: The batch sizes to make of each item.

    Returns:
        One sample per item and batch size, in that order.

    Raises:
        InvalidInputError: ``batch_sizes`` is empty or not positive, or an item has no tensor
            with a batch axis.

    Example:
        >>> import torch, tunetree as tt
        >>> [s.args[0].shape[0] for s in tt.rebatch([torch.randn(2, 4)], [1, 8])]
        [1, 8]
    """
    if not batch_sizes or any(not isinstance(b, int) or b < 1 for b in batch_sizes):
        raise InvalidInputError("batch_sizes must be a non-empty list of positive integers")
    out: list[Sample] = []
    for sample in as_samples(dataset):
        leaves = set(batch_axis_leaves(sample))
        if not leaves:
            raise InvalidInputError("a dataset item has no tensor with a batch axis to re-batch")
        out.extend(_with_batch(sample, leaves, b) for b in batch_sizes)
    return out


def _with_batch(sample: Sample, leaves: set[int], size: int) -> Sample:
    def one(leaf: int, tensor: torch.Tensor) -> torch.Tensor:
        return resize_axis(tensor, 0, size).clone() if leaf in leaves else tensor

    return map_leaves(sample, one)


# --------------------------------------------------------------------------- value probes


def value_probes(sample: Sample, seed: int = 0) -> list[Sample]:
    """Calls with the same shapes and other values.

    Floating inputs are negated, and drawn afresh with each tensor's mean and spread. A backend that
    baked one branch of a value-dependent ``if`` into its graph answers one of them differently from
    eager.
    """
    generator = torch.Generator().manual_seed(seed)

    def negate(_: int, t: torch.Tensor) -> torch.Tensor:
        return -t if t.is_floating_point() else t

    def redraw(_: int, t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or t.numel() == 0:
            return t
        std, mean = (
            torch.std_mean(t.float()) if t.numel() > 1 else (torch.tensor(1.0), t.float().mean())
        )
        noise = torch.randn(t.shape, generator=generator).to(t.device)
        return (noise * (std if std > 0 else 1.0) + mean).to(t.dtype)

    if not any(t.is_floating_point() for t in _tensors(sample)):
        return []
    return [map_leaves(sample, negate), map_leaves(sample, redraw)]
