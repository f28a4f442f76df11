"""Host memory for recorded tensors that wait between uses while tuning on an accelerator.

Eager's outputs of a graph's recorded calls are references: a candidate's outputs are compared
with them, one call at a time, and nothing else reads their values. A decode step's output holds
the whole cache, and a prefill's its logits; kept on the device for every graph until tuning
ends, they were the largest part of tuning's peak device memory above the model. Parked, each
tensor of a tree that lives on an accelerator is copied to host memory and its device noted;
:func:`unpark` copies it back when it is used. Dtypes and shapes (what backends read from eager's
outputs to build) are the same in both places, and a tree wholly in host memory is left as it is.
"""

from __future__ import annotations

from typing import Any

import torch

from .graph import Graph, flatten, unflatten

HOST = torch.device("cpu")
"""Where parked tensors wait."""

Homes = tuple[torch.device | None, ...]
"""For each leaf of a parked tree, the device its tensor goes back to (None: not moved)."""


def park(tree: Any) -> tuple[Any, Homes | None]:
    """``tree`` with its accelerator tensors copied to host memory, and where they go back.

    Returns ``(tree, None)`` unchanged when no tensor of it is on an accelerator.
    """
    leaves, spec = flatten(tree)
    homes: Homes = tuple(_accelerator(leaf) for leaf in leaves)
    if not any(homes):
        return tree, None
    parked = [
        leaf.to(HOST) if home is not None else leaf
        for leaf, home in zip(leaves, homes, strict=True)
    ]
    return unflatten(parked, spec), homes


def unpark(tree: Any, homes: Homes | None) -> Any:
    """A copy of a parked ``tree``, each tensor back on its device (``tree`` when not parked)."""
    if homes is None:
        return tree
    leaves, spec = flatten(tree)
    if len(leaves) != len(homes):
        raise ValueError(f"a parked tree of {len(homes)} leaves now has {len(leaves)}")
    back = [
        leaf.to(home) if home is not None else leaf
        for leaf, home in zip(leaves, homes, strict=True)
    ]
    return unflatten(back, spec)


def all_moved(tree: Any, homes: Homes) -> bool:
    """Whether every tensor of the parked ``tree`` goes back to a device.

    An unparked copy of such a tree shares no tensor with it: a run may mutate the copy.
    """
    leaves, _ = flatten(tree)
    return all(
        home is not None
        for leaf, home in zip(leaves, homes, strict=True)
        if isinstance(leaf, torch.Tensor)
    )


def _accelerator(leaf: Any) -> torch.device | None:
    if not isinstance(leaf, torch.Tensor) or leaf.device.type in ("cpu", "meta"):
        return None
    return leaf.device


def park_outputs(graph: Graph) -> None:
    """Park eager's outputs of ``graph`` in host memory (once; a no-op for host graphs)."""
    if graph.output_homes is not None:
        return
    parked = [park(output) for output in graph.outputs]
    if all(homes is None for _, homes in parked):
        return
    graph.outputs = [tree for tree, _ in parked]
    graph.output_homes = [homes for _, homes in parked]


def reference(graph: Graph, index: int) -> Any:
    """Eager's output of ``graph``'s sample ``index``, on the device it was computed on."""
    homes = None if graph.output_homes is None else graph.output_homes[index]
    return unpark(graph.outputs[index], homes)
