"""The integers a cache layer keeps beside its tensors: sizes they repeat, and positions.

A static cache layer holds Python ints next to its key/value tensors: its capacity and batch
(``max_cache_len``, ``batch_size``, the head counts: each the size of one axis of ``keys``),
and a sliding-window layer also how many positions were written so far
(``cumulative_length_int`` on a static one, ``cumulative_length`` on a dynamic one). Keyed by
value, these ints would make every decode step a graph of its own (the position grows by one
per token) and every cache capacity a structure of its own (no range could span them).

So a signature reads them as what they are:

- a **mirrored size** (an int equal to the size of an axis of one of the layer's tensors) is
  keyed as that axis, which the tensor's shape already carries, so capacities and batch sizes
  get ranges like any other axis; a layer rebuilt around tensors of other sizes (a resized
  probe, a runner's outputs) takes its sizes from them (:func:`mirrored_sizes`);
- a **position** below the layer's capacity is keyed as ``below capacity``: every step that
  writes inside the capacity takes the same branches of the layer's code, so one graph serves
  them all; the position itself is a value the step advances (:func:`positions_of`). A
  position at or past the capacity (a sliding window that has filled) keeps its value;
- a **carried position**: a dynamic sliding-window layer past its window keeps ``window - 1``
  positions, so no tensor repeats how many were written, yet that count decides where the
  attention mask starts (``get_mask_sizes``' offset). It travels as the length of an empty
  tensor (:func:`position_carrier`, shape ``(0, position)``): the key gets a range over it
  like over any axis, an exporter sees the position as a symbolic size and computes the
  mask from it, and a runner's output carries the advanced position back the same way
  (:func:`carried_position`). Without it each step past the window was a graph of its own.
  Below the window the position is the keys' length, which never exceeds ``window - 1``:
  every step up to the one that fills the window takes the same branches, so a range over
  them may reach up to it (``tunetree.signature.windows``).

Nothing here imports ``transformers``; attributes are found by name on cache objects.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

MIRRORED: dict[str, tuple[str, int]] = {
    "max_cache_len": ("keys", -2),
    "batch_size": ("keys", 0),
    "max_batch_size": ("keys", 0),
    "num_heads": ("keys", 1),
    "head_dim": ("keys", -1),
    "k_head_dim": ("keys", -1),
    "v_head_dim": ("values", -1),
}
"""Int attributes of a cache layer that repeat the size of an axis of one of its tensors."""

POSITIONS = ("cumulative_length_int", "cumulative_length")
"""Int attributes of a cache layer that count the positions written so far."""

CAPACITY = "max_cache_len"
"""The attribute holding a static layer's capacity (positions it can hold)."""


@dataclass(frozen=True)
class Derived:
    """How a signature keys an int that is not a constant of the call's structure.

    ``Derived("axis", "keys[-2]")``: the size of that axis (the shape carries it);
    ``Derived("position", "below capacity")``: a position inside the layer's capacity.
    """

    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


BELOW_CAPACITY = Derived("position", "below capacity")


CARRIER_DTYPE = torch.uint8
"""The dtype of a position carrier (it holds no element; the dtype only names it)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_size(value: Any) -> bool:
    """An int, or a symbolic int while an exporter traces (a carried position, a size)."""
    return _is_int(value) or isinstance(value, torch.SymInt)


def _mirror_of(attributes: dict[str, Any], name: str) -> tuple[str, int] | None:
    """The (tensor attribute, axis) the attribute ``name`` may repeat the size of, or None."""
    where = MIRRORED.get(name)
    if where is None and name in POSITIONS and CAPACITY not in attributes:
        where = ("keys", -2)  # a dynamic sliding-window layer's length, before the window fills
    return where


def _axis_key(where: tuple[str, int]) -> Derived:
    return Derived("axis", f"{where[0]}[{where[1]}]")


def mirrored_axis(attributes: dict[str, Any], name: str) -> tuple[str, int] | None:
    """The (tensor attribute, axis) whose size the int ``attributes[name]`` repeats, or None."""
    where = _mirror_of(attributes, name)
    if where is None:
        return None
    value = attributes.get(name)
    tensor = attributes.get(where[0])
    if not _is_size(value) or not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        return None
    if -tensor.dim() > where[1] or where[1] >= tensor.dim():
        return None
    # While an exporter traces, both may be symbolic; equal expressions compare True without a
    # guard, and the graph's ranges decide the others (as they do for the eager call).
    return where if bool(tensor.shape[where[1]] == value) else None


def carried_position(attributes: dict[str, Any], name: str) -> bool:
    """Whether ``attributes[name]`` is a position that travels as a carrier (see module doc).

    A position of a dynamic layer (no capacity) that holds tensors, when no tensor's size
    repeats it: a sliding window that has filled.
    """
    if name not in POSITIONS or CAPACITY in attributes:
        return False
    value, keys = attributes.get(name), attributes.get("keys")
    if not _is_size(value) or not isinstance(keys, torch.Tensor) or keys.dim() < 2:
        return False
    if _CARRY_ALL.get():  # no comparison: while an exporter traces, it would guard the size
        return True
    return mirrored_axis(attributes, name) is None


_CARRY_ALL: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tunetree_carry_all_positions", default=False
)


@contextmanager
def carrying_positions() -> Iterator[None]:
    """In the block, every position of a dynamic layer travels as a carrier, mirrored or not.

    For the outputs of one exported graph: a prefill whose range spans a sliding window
    leaves a layer whose position is the keys' length below the window (a mirrored size, no
    tensor) and a carried one past it (an extra tensor), so an output structure taken from
    one side misplaces every tensor after that layer on the other. Carried on both sides,
    the structure is one, and the rebuilt layer takes its position from the carrier (right
    on both sides) instead of from the keys' length (right only below the window).
    """
    token = _CARRY_ALL.set(True)
    try:
        yield
    finally:
        _CARRY_ALL.reset(token)


def position_carrier(attributes: dict[str, Any], name: str) -> torch.Tensor | None:
    """The carrier of the position ``attributes[name]``, or None where it is not carried.

    An empty tensor on the layer's device whose second axis is the position long (no memory
    is allocated). What a key, a flattened state and a runner reading by path all put in the
    position's place.
    """
    if not carried_position(attributes, name):
        return None
    position = attributes[name]
    return torch.empty((0, position), dtype=CARRIER_DTYPE, device=attributes["keys"].device)


def is_position_carrier(value: Any) -> bool:
    """Whether ``value`` is shaped like a position carrier (a saved key's stand-in)."""
    return (
        isinstance(value, torch.Tensor)
        and value.dtype == CARRIER_DTYPE
        and value.dim() == 2
        and value.shape[0] == 0
    )


def carried_value(carrier: torch.Tensor) -> Any:
    """The position a carrier holds: an int, or a symbolic size while an exporter traces."""
    return carrier.shape[1]


def is_below_capacity(attributes: dict[str, Any], name: str) -> bool:
    """Whether ``attributes[name]`` is a position inside the layer's capacity."""
    value, capacity = attributes.get(name), attributes.get(CAPACITY)
    if name not in POSITIONS or not isinstance(value, int) or not isinstance(capacity, int):
        return False
    return _is_int(value) and _is_int(capacity) and 0 <= value < capacity


def key_value(attributes: dict[str, Any], name: str) -> Any:
    """What a signature holds for the attribute ``name`` of a cache object (see module doc)."""
    value = attributes[name]
    if not _is_int(value):
        return value
    carrier = position_carrier(attributes, name)
    if carrier is not None:
        return carrier
    if is_below_capacity(attributes, name):
        return BELOW_CAPACITY
    where = mirrored_axis(attributes, name)
    if where is not None:
        return _axis_key(where)
    return value


def derived_value(attributes: dict[str, Any], name: str, key: str) -> int | None:
    """The int :func:`key_value` keyed as the :class:`Derived` text ``key``, on rebuilt data.

    ``attributes`` are a rebuilt layer's other attributes (its tensors among them). A
    position below capacity is 0 (any position inside it does); a mirrored size is its
    tensor's size. None where ``name`` is never keyed as ``key`` (a hostile or foreign key).
    """
    if key == str(BELOW_CAPACITY):
        return 0 if name in POSITIONS else None
    where = _mirror_of(attributes, name)
    if where is None or key != str(_axis_key(where)):
        return None
    tensor = attributes.get(where[0])
    if not isinstance(tensor, torch.Tensor) or not -tensor.dim() <= where[1] < tensor.dim():
        return None
    return int(tensor.shape[where[1]])


def mirrored_names(attributes: dict[str, Any]) -> tuple[str, ...]:
    """The attributes of a cache object that repeat one of its tensors' sizes."""
    carry_all = _CARRY_ALL.get()
    return tuple(
        name
        for name in sorted(attributes)
        if not is_below_capacity(attributes, name)
        and not (carry_all and carried_position(attributes, name))
        and mirrored_axis(attributes, name)
    )


def mirrored_sizes(names: tuple[str, ...], data: dict[str, Any]) -> Iterator[tuple[str, int]]:
    """The sizes the attributes ``names`` take from the tensors in ``data`` (rebuilt layer).

    The size as the tensor has it: an int when called eagerly, a symbolic size while an
    exporter traces, so a capacity that varies (a static cache sized by each prompt) stays a
    range instead of being fixed to the example's.
    """
    for name in names:
        attribute, axis = MIRRORED.get(name, ("keys", -2))
        tensor = data.get(attribute)
        if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
            yield name, tensor.shape[axis]


def positions_of(objects: list[Any]) -> list[tuple[int, str, int]]:
    """``(index in objects, attribute, value)`` of every position below capacity."""
    found = []
    for i, obj in enumerate(objects):
        attributes = vars(obj)
        for name in POSITIONS:
            if is_below_capacity(attributes, name):
                found.append((i, name, attributes[name]))
    return found


def capacity_of(obj: Any) -> int | None:
    """A static layer's capacity, or None."""
    value = vars(obj).get(CAPACITY)
    return value if _is_int(value) else None
