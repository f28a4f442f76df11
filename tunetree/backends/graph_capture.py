"""Capture one call in a device graph: its static inputs, the warm-ups and the capture itself.

A device graph replays fixed memory: the call's tensors are copied into static buffers made
once (:class:`StaticInputs`), the forward is warmed up on a side stream and captured
(:func:`capture`). A call that updates its inputs (a decode step appends to its cache)
starts every warm-up and the capture from the sample's values again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import BackendError
from ..signature.graph import GraphKey, Sample, flatten
from ..signature.graph import unflatten as unflatten_tree
from ..signature.stateful import nested_cache_objects, positions_of, to_data
from .graph_api import GraphApi, drop_workspaces, own_workspaces

CONSTANT_TYPES = (type(None), bool, int, float, str, torch.dtype, torch.device)
"""Argument types a capture bakes in as constants (a call passes them as they were)."""


def pick(root: Any, path: Sequence[Any]) -> Any:
    """The value at a pytree key path inside a call's raw ``(args, kwargs)``."""
    value = root
    try:
        for key in path:
            if isinstance(value, torch.Tensor):  # a container was expected here
                raise TypeError(f"a tensor where the captured call had a container at {key}")
            if isinstance(key, pytree.GetAttrKey):
                value = getattr(value, key.name)
            else:
                value = value[key.idx if isinstance(key, pytree.SequenceKey) else key.key]
    except (AttributeError, IndexError, KeyError, TypeError) as exc:
        raise BackendError(
            "a device graph replays one input structure only; this call's arguments are "
            f"structured differently from the captured call ({exc!r}; tune with this input)"
        ) from exc
    return value


def copy_into(static: torch.Tensor, value: Any, where: int | str) -> None:
    """Copy one call's input into its static buffer, refusing another dtype or shape."""
    if not isinstance(value, torch.Tensor):
        raise BackendError(f"input {where!r}: expected a tensor, got {type(value).__name__}")
    if value is static or (
        value.data_ptr() == static.data_ptr()
        and value.shape == static.shape
        and value.dtype == static.dtype
    ):
        return  # the static buffer itself, handed back by the previous replay (a cache)
    if value.shape != static.shape or value.dtype != static.dtype:
        raise BackendError(
            f"input {where!r} is {value.dtype}{list(value.shape)} but the device graph was "
            f"captured for {static.dtype}{list(static.shape)}: device graphs have static "
            "shapes; tune with this input shape too"
        )
    static.copy_(value)


@dataclasses.dataclass
class StaticInputs:
    """The captured call's inputs: static buffers made from one sample, and where each sits."""

    spec: Any
    """The call's pytree structure (keyword arguments in name order)."""
    leaves: list[Any]
    """The call's leaves: tensors cloned into static buffers, constants as they are."""
    tensor_slots: list[tuple[int, torch.Tensor]]
    """``(leaf index, static buffer)`` of each tensor input."""
    paths: list[Any]
    """Where each tensor input sits (through cache objects' attributes too): a nested call is
    served by picking its tensors, without flattening it again."""
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    """The static call itself (built on the static buffers)."""
    top_slots: list[tuple[int | str, torch.Tensor]] | None
    """For a call of tensors and constants at the top level (``model(x, ...)``,
    ``model(**batch)``): where each tensor is passed; None when arguments are nested."""
    first: list[tuple[torch.Tensor, torch.Tensor]]
    """Each static buffer with the sample's value: every warm-up and the capture start there."""

    @classmethod
    def of(cls, sample: Sample) -> StaticInputs:
        """Static buffers for ``sample``'s call (a copy of each of its tensors)."""
        # Keyword arguments in name order: a call may pass them in any order (and a sample
        # rebuilt from a GraphKey has them sorted), the graph does not care.
        call = (sample.args, dict(sorted(sample.kwargs.items())))
        leaves, spec = flatten(call)
        static = [
            leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves
        ]
        slots = [(i, leaf) for i, leaf in enumerate(static) if isinstance(leaf, torch.Tensor)]
        with_paths, _ = pytree.tree_flatten_with_path(to_data(call))
        paths = [path for path, leaf in with_paths if isinstance(leaf, torch.Tensor)]
        args, kwargs = unflatten_tree(static, spec)
        top = [*enumerate(args), *kwargs.items()]
        top_slots = (
            [(where, v) for where, v in top if isinstance(v, torch.Tensor)]
            if all(isinstance(v, (torch.Tensor, *CONSTANT_TYPES)) for _, v in top)
            else None
        )
        first = [(buffer, leaves[i].detach()) for i, buffer in slots]
        return cls(spec, static, slots, paths, args, kwargs, top_slots, first)

    @property
    def top(self) -> list[tuple[int | str, Any]]:
        """The static call's top-level arguments: ``(position or keyword, value)``."""
        return [*enumerate(self.args), *self.kwargs.items()]


@dataclasses.dataclass
class Captured:
    """A captured graph, its static output and the positions its call advances."""

    graph: Any
    output: Any
    advances: list[tuple[int, str, int]]
    """``(object index, attribute, by how much)``: a replay runs no Python, so the runner moves
    these positions as eager's code did during the capture."""


def capture(
    api: GraphApi,
    device: torch.device,
    inputs: StaticInputs,
    objects: list[Any],
    forwards: tuple[Callable[..., Any], Callable[..., Any]],
    warmup: int,
    pool: Any,
) -> Captured:
    """Warm up and capture the static call; ``forwards``: the first warm-up's and the others'.

    The first warm-up runs eager's forward when a compiled one is captured: a call that changes
    its own structure is refused before anything is compiled for it. ``objects`` are the call's
    state objects: their constants are reset with the tensors before every run.

    Raises:
        BackendError: The call changes its own structure, or the capture failed.
    """
    args, kwargs = inputs.args, inputs.kwargs
    ints = [
        (obj, {k: v for k, v in vars(obj).items() if isinstance(v, CONSTANT_TYPES)})
        for obj in objects
    ]

    def reset() -> None:
        for static, value in inputs.first:
            static.copy_(value)
        for obj, values in ints:
            obj.__dict__.update(values)

    first, forward = forwards
    # The call's structure, cache positions read as values.
    structure = GraphKey.of(args, kwargs)
    with api.device_guard(device), torch.no_grad(), own_workspaces(api):
        # Warm up on a side stream: lazy initialisation (cuBLAS handles, Inductor's first
        # compile, autotuning) must not happen inside the capture.
        side = api.stream()
        side.wait_stream(api.current_stream())
        with api.use_stream(side):
            for step in range(warmup):
                reset()
                (forward if step else first)(*args, **kwargs)
                if GraphKey.of(args, kwargs) != structure:
                    raise BackendError(
                        "the call changes the structure of its own arguments (a cache "
                        "initialised on first use, as in a prefill step): a device graph "
                        "replays fixed inputs only"
                    )
        api.current_stream().wait_stream(side)
        # The warm-ups' workspace (their side stream's) is not the capture's: dropped, so that
        # it is not held through the capture.
        drop_workspaces(api)
        reset()
        before = positions_of(objects)
        graph = api.graph()
        try:
            capturing = api.capture(graph) if pool is None else api.capture(graph, pool=pool)
            with capturing:
                output = forward(*args, **kwargs)
        except Exception as exc:
            raise BackendError(
                f"could not capture a device graph: {type(exc).__name__}: {exc}. "
                "The forward must not synchronise with the CPU (.item(), .tolist(), "
                "printing tensors, data-dependent shapes); use another backend for it"
            ) from exc
    advances = [(i, name, vars(objects[i])[name] - value) for i, name, value in before]
    return Captured(graph, output, advances)


def static_objects(inputs: StaticInputs) -> list[Any]:
    """The state objects of the static call, in a fixed order (positions are indexed by it)."""
    return nested_cache_objects((inputs.args, inputs.kwargs))
