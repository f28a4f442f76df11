"""Why a call of a wrapped module runs its original forward, in words that point at the cause.

A key's text shows the first two tensors of a cache object only, so a call outside a tuned range
can print exactly like the range when the axis that differs is elided: :func:`outside_range`
names the tensor and the axis.
"""

from __future__ import annotations

from typing import Any

from ..signature.graph import Dim, GraphKey, TensorSpec


def outside_range(ranged: GraphKey, exact: GraphKey) -> str:
    """Where the call keyed ``exact`` first falls outside the ranges of ``ranged``.

    Args:
        ranged: A tuned key with ranges, of the same pattern as ``exact``.
        exact: The call's exact key.

    Returns:
        A phrase such as ``past_key_values tensor 3 (f32[1,1,9,4]) axis 2 is 9, outside s 3..5``
        (empty when the call is inside the ranges).
    """
    ours, theirs = ranged.tensor_specs(), exact.tensor_specs()
    labels = leaf_labels(exact)
    if len(ours) != len(theirs):
        return f"the call has {len(theirs)} tensors, the range {len(ours)}"
    bound: dict[str, tuple[int, str]] = {}
    for index, (want, got) in enumerate(zip(ours, theirs, strict=True)):
        label = f"{labels[index]} ({got})"
        if want.dtype != got.dtype or len(want.shape) != len(got.shape):
            return f"{label} is not {want}"
        for axis, (size, have) in enumerate(zip(want.shape, got.shape, strict=True)):
            assert isinstance(have, int)
            where = f"{label} axis {axis} is {have}"
            if not isinstance(size, Dim):
                if size != have:
                    return f"{where}, tuned with {size} only"
                continue
            if not size.accepts(have):
                return f"{where}, outside {size}"
            first = bound.setdefault(size.name, (have, f"{labels[index]} axis {axis}"))
            if first[0] != have:
                return f"{where}, but {first[1]} is {first[0]} (both are {size.name} when tuned)"
    return ""


def leaf_labels(key: GraphKey) -> list[str]:
    """A name for each tensor leaf of ``key``, in :meth:`GraphKey.tensor_specs` order.

    ``argument 0``, ``attention_mask``, or ``past_key_values tensor 3`` for a leaf inside a
    container or a cache object.
    """
    labels: list[str] = []
    named = [(f"argument {i}", sig) for i, sig in enumerate(key.args)] + list(key.kwargs)
    for name, sig in named:
        single = GraphKey((sig,), ())
        count = len(single.tensor_specs())
        if count == 1 and isinstance(sig, TensorSpec):
            labels.append(name)
        else:
            labels.extend(f"{name} tensor {j}" for j in range(count))
    return labels


def no_runner(path: str, key: Any, reason: str) -> str:
    """The warning for a call of a graph that was tuned but that no candidate serves."""
    return (
        f"{path or '<model>'}: graph {key} was tuned, but no candidate serves it ({reason}); "
        "running the original forward"
    )
