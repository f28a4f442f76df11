"""A ranged graph as the building backends need it: Dims per axis and an example call.

For each tensor input, the :class:`~tunetree.signature.graph.Dim` of each dynamic axis, and an
example call to export or compile from.

Exporters and compilers specialise sizes 0 and 1 and may unify dynamic axes whose example
sizes are equal, so the example has every dynamic size at 2 or more and different
dimensions at different sizes. Tensors are addressed in ``GraphKey.tensor_specs`` order,
which is the order of the tensor leaves of ``(args, kwargs sorted by name)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import BackendError
from ..signature.graph import (
    Dim,
    Graph,
    GraphKey,
    Sample,
    TensorSpec,
    flatten,
    resize_axis,
    unflatten,
)

AxisDims = dict[int, Dim]
"""The dynamic axes of one tensor input: axis -> its dimension."""


def axis_dims(key: GraphKey) -> list[AxisDims]:
    """Per tensor input (``tensor_specs`` order), its dynamic axes and their dimensions."""
    return [
        {axis: size for axis, size in enumerate(spec.shape) if isinstance(size, Dim)}
        for spec in key.tensor_specs()
    ]


def call_sizes(tensors: Sequence[torch.Tensor], dims: Sequence[AxisDims]) -> dict[str, int]:
    """The size each named dimension takes in one call's tensor inputs."""
    return {
        dim.name: int(tensor.shape[axis])
        for tensor, axes in zip(tensors, dims, strict=True)
        for axis, dim in axes.items()
    }


def example_sizes(
    dims: Mapping[str, Dim], preferred: Mapping[str, int] | None = None
) -> dict[str, int]:
    """A size per dimension to export with.

    The preferred size where it is usable, each at least 2 (when the range allows) and no two
    dimensions at the same size.
    """
    preferred = preferred or {}
    chosen: dict[str, int] = {}
    for name in sorted(dims):
        dim = dims[name]
        low = min(max(dim.min, 2), dim.max)
        start = min(max(preferred.get(name, low), low), dim.max)
        taken = set(chosen.values())
        candidates = [*range(start, dim.max + 1), *range(start - 1, low - 1, -1)]
        chosen[name] = next((n for n in candidates if n not in taken), start)
    return chosen


def resize_inputs(
    tensors: Sequence[torch.Tensor], dims: Sequence[AxisDims], sizes: Mapping[str, int]
) -> list[torch.Tensor]:
    """Each tensor input with its dynamic axes at ``sizes`` (contiguous copies)."""
    resized = []
    for tensor, axes in zip(tensors, dims, strict=True):
        for axis, dim in axes.items():
            tensor = resize_axis(tensor, axis, sizes[dim.name])
        resized.append(tensor.contiguous().clone())
    return resized


def sample_tensors(sample: Sample) -> tuple[list[Any], Any, list[int]]:
    """A call's leaves in ``tensor_specs`` order, its structure, and where its tensors are."""
    kwargs = {k: sample.kwargs[k] for k in sorted(sample.kwargs)}
    leaves, spec = flatten((tuple(sample.args), kwargs))
    return leaves, spec, [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]


def resize_sample(sample: Sample, key: GraphKey, sizes: Mapping[str, int]) -> Sample:
    """A copy of ``sample`` (a call inside ``key``'s ranges) at ``sizes``."""
    leaves, spec, where = sample_tensors(sample)
    dims = axis_dims(key)
    if len(where) != len(dims):
        raise BackendError(
            f"the call has {len(where)} tensor inputs, the graph {len(dims)}: cannot resize it"
        )
    resized = resize_inputs([leaves[i] for i in where], dims, sizes)
    for i, tensor in zip(where, resized, strict=True):
        leaves[i] = tensor
    args, kwargs = unflatten(leaves, spec)
    return Sample(tuple(args), dict(kwargs))


def example_sample(graph: Graph) -> Sample:
    """The call to export or compile ``graph`` from.

    A recorded sample when the graph has no ranges, else the largest recorded sample resized
    to :func:`example_sizes`.
    """
    if not graph.samples:
        raise BackendError("the graph has no recorded sample to build from")
    if not graph.key.is_dynamic:
        return graph.samples[0]
    dims = axis_dims(graph.key)

    def elements(sample: Sample) -> int:
        leaves, _, where = sample_tensors(sample)
        return sum(int(leaves[i].numel()) for i in where)

    base = max(graph.samples, key=elements)
    leaves, _, where = sample_tensors(base)
    sizes = example_sizes(graph.key.dims(), call_sizes([leaves[i] for i in where], dims))
    return resize_sample(base, graph.key, sizes)


def export_dynamic_shapes(key: GraphKey) -> tuple[tuple[dict[int, Any], ...]] | None:
    """``torch.export`` dynamic shapes for a flat module ``forward(*tensors)``.

    One ``torch.export.Dim`` per named dimension, with its min and max; the outer tuple is the
    variadic parameter. None for a graph without ranges.
    """
    if not key.is_dynamic:
        return None
    exported = {
        name: torch.export.Dim(name, min=dim.min, max=dim.max) for name, dim in key.dims().items()
    }
    per_input = tuple(
        {axis: exported[dim.name] for axis, dim in axes.items()} for axes in axis_dims(key)
    )
    return (per_input,)


def describe_ranges(key: GraphKey) -> str:
    """The graph's dimensions in one phrase, e.g. ``batch 1..64, seq 8..256``."""
    return ", ".join(str(dim) for dim in key.dims().values())


def placeholder_elements(key: GraphKey) -> int:
    """Elements of the placeholder tensors a loader makes from ``key`` alone.

    Every tensor at :meth:`~tunetree.signature.graph.TensorSpec.example_shape`, to refuse a huge one
    before making it.
    """
    return sum(math.prod(spec.example_shape()) for spec in key.tensor_specs())


def check_placeholders(key: GraphKey, max_elements: int) -> None:
    """BackendError when placeholders shaped like ``key`` would hold over ``max_elements``."""
    elements = placeholder_elements(key)
    if elements > max_elements:
        raise BackendError(
            f"rebuilding the runner would allocate placeholder inputs of {elements} elements "
            f"for the graph {key}, over the {max_elements} elements a file of this size can "
            "account for (tunetree.runtime.artifacts.allowed_elements): refused before allocating"
        )


AxisBounds = tuple[int, int | None]
"""The sizes an artifact's input axis takes: from ``min`` to ``max`` (None: unbounded)."""


def narrowed_to_artifact(
    key: GraphKey,
    specs: Sequence[TensorSpec],
    bounds: Sequence[Sequence[AxisBounds] | None],
    what: str,
) -> GraphKey:
    """``key`` with each range narrowed to what an artifact's inputs declare they take.

    ``specs`` are the key's tensors the artifact's inputs read and ``bounds`` what the
    artifact declares for each (None: any rank and size). A fixed size, or a rank, that the
    artifact does not take, or a range left empty, is a BackendError naming ``what``; the
    key itself comes back when nothing narrows.
    """
    narrowed = dict(key.dims())
    for number, (spec, axes) in enumerate(zip(specs, bounds, strict=True)):
        if axes is None:
            continue
        if len(axes) != len(spec.shape):
            raise BackendError(
                f"{what}'s input {number} has rank {len(axes)}, the graph's {spec} rank "
                f"{len(spec.shape)}: the saved runner does not fit its graph"
            )
        for axis, (size, (low, high)) in enumerate(zip(spec.shape, axes, strict=True)):
            if not isinstance(size, Dim):
                if size < low or (high is not None and size > high):
                    raise BackendError(
                        f"{what}'s input {number} takes sizes {low}..{high or 'any'} on axis "
                        f"{axis}, where the graph's {spec} has {size}: the saved runner does "
                        "not fit its graph"
                    )
                continue
            now = narrowed[size.name]
            top = now.max if high is None else min(now.max, high)
            bottom = max(now.min, low)
            if bottom > top:
                raise BackendError(
                    f"{what} serves no size of {size} (its input {number} takes "
                    f"{low}..{high or 'any'} on axis {axis}): the saved runner does not fit "
                    "its graph"
                )
            narrowed[size.name] = Dim(size.name, bottom, top)
    if narrowed == key.dims():
        return key
    return GraphKey(_with_dims(key.args, narrowed), _with_dims(key.kwargs, narrowed))


def _with_dims(sig: Any, dims: Mapping[str, Dim]) -> Any:
    """A signature with every :class:`Dim` replaced by the one of its name in ``dims``."""
    if isinstance(sig, TensorSpec):
        shape = tuple(dims[s.name] if isinstance(s, Dim) else s for s in sig.shape)
        return TensorSpec(sig.dtype, shape)
    if isinstance(sig, tuple) and not (len(sig) == 3 and sig[0] in ("const", "object")):
        return tuple(_with_dims(part, dims) for part in sig)
    return sig
