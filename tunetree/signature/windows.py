"""How a sliding window bounds the ranges over a cache layer's sizes.

A dynamic sliding-window layer (:mod:`tunetree.hf.positions`) takes the same branches at
every position past its window (its position travels as a carrier tensor), and at every
length of its keys below the window up to ``window - 1``, the step that fills the window
included. So a range over a carried position reaches down to the window
(:func:`carried_floors`, :func:`lowered_to_floor`) and a range over the keys below the window
up to ``window - 1`` (:func:`window_ceilings`, :func:`raised_to_ceiling`), with the axes that
move with them (the attention mask, a full-attention layer's keys): an unseen prompt that
crosses the window then needs no tuning prompt that crossed it. :func:`.shapes.ranged_key`
widens the ranges; the candidates are checked at the widened ends like at any other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from ..hf import CARRIER_DTYPE, POSITIONS, Derived
from .graph import GraphKey, TensorSpec, dtype_name

AxisRef = tuple[int, int]
"""(tensor leaf in ``tensor_specs`` order, axis)."""


def carried_floors(key: GraphKey) -> dict[int, int]:
    """Tensor leaves (``tensor_specs`` order) that carry a sliding window's position.

    Each maps to the smallest position it can carry: the layer's window
    (:mod:`tunetree.hf.positions`). Positions past the window take the same branches, so
    a range over them may reach down to it.
    """
    floors: dict[int, int] = {}

    def visit(attributes: Mapping[str, Any], name: str, value: Any, leaf: int) -> None:
        window = attributes.get("sliding_window")
        if (
            name in POSITIONS
            and isinstance(value, TensorSpec)
            and value.dtype == dtype_name(CARRIER_DTYPE)
            and len(value.shape) == 2
            and value.shape[0] == 0
            and isinstance(window, tuple)
            and window[:2] == ("const", "int")
        ):
            floors[leaf] = window[2]

    _walk_layers(key, visit)
    return floors


def window_ceilings(key: GraphKey, filled: Collection[int]) -> dict[AxisRef, int]:
    """Axes of a sliding window's keys and values below the window, with their ceiling.

    ``(leaf, axis)`` (``tensor_specs`` order) of the length axis of each dynamic
    sliding-window layer whose position is still its keys' length, mapped to the most such a
    layer holds: ``window - 1``. Every step up to the one that fills the window takes the
    same branches (:mod:`tunetree.hf.positions`), so a range over them may reach up to it.

    Only windows in ``filled`` (:func:`filled_windows` of the module's recorded calls):
    where no recorded call went past a window (Gemma2's and Mistral's are 4096 positions
    long), steps past it have no graph anyway, and a probe at ``window - 1`` would hold a
    cache longer than any call the user made.
    """
    ceilings: dict[AxisRef, int] = {}

    def visit(attributes: Mapping[str, Any], name: str, value: Any, leaf: int) -> None:
        ceiling = _window_ceiling(attributes)
        if (
            ceiling is not None
            and name in ("keys", "values")
            and isinstance(value, TensorSpec)
            and len(value.shape) >= 2
        ):
            ceilings[(leaf, len(value.shape) - 2)] = ceiling

    _walk_layers(key, visit)
    return {ref: c for ref, c in ceilings.items() if c + 1 in filled}


def filled_windows(keys: Iterable[GraphKey]) -> frozenset[int]:
    """The windows of the sliding-window layers that some of ``keys`` holds past its window."""
    return frozenset(w for key in keys for w in carried_floors(key).values())


def lowered_to_floor(
    groups: Mapping[tuple[int, ...], list[AxisRef]], floors: Mapping[int, int]
) -> dict[tuple[int, ...], int]:
    """How far each group of axes reaches below its smallest size, for carried positions.

    A sliding window's carried position (:func:`carried_floors`) past the
    window takes every value from the window up with the same code, so its range reaches
    down to the window; axes that move with it call for call (one size sequence plus a
    constant, seen at three sizes or more: the attention mask, a full-attention layer's keys)
    reach down as far. The candidates are checked at the widened range's ends like any other.
    """
    lowered: dict[tuple[int, ...], int] = {}
    for sizes, refs in groups.items():
        floor = min(
            (floors[leaf] for leaf, axis in refs if axis == 1 and leaf in floors), default=None
        )
        if floor is None or min(sizes) <= floor:
            continue
        below = min(sizes) - floor
        for other in groups:
            offsets = {b - a for a, b in zip(sizes, other, strict=True)}
            if other == sizes or (len(offsets) == 1 and len(set(other)) >= 3):
                lowered[other] = max(lowered.get(other, 0), below)
    return lowered


def raised_to_ceiling(
    groups: Mapping[tuple[int, ...], list[AxisRef]], ceilings: Mapping[AxisRef, int]
) -> dict[tuple[int, ...], int]:
    """How far each group of axes reaches above its largest size, for a sliding window's keys.

    A dynamic sliding-window layer below its window (:func:`window_ceilings`)
    takes every length up to ``window - 1`` with the same code, the step that fills the
    window included, so its keys' range reaches up to that; axes that move with them call for
    call (one size sequence plus a constant, seen at three sizes or more: the attention mask,
    a full-attention layer's keys) reach up as far; the keys too must have been seen at three
    sizes, else the axes moving with them are not known and a probe at the raised end would
    pair the keys with a mask of another length. Without it the step that fills the window
    lay outside every range unless a tuning call happened to make it. The candidates are
    checked at the widened range's ends like any other.
    """
    raised: dict[tuple[int, ...], int] = {}
    for sizes, refs in groups.items():
        ceiling = min((ceilings[ref] for ref in refs if ref in ceilings), default=None)
        if ceiling is None or max(sizes) >= ceiling or len(set(sizes)) < 3:
            continue  # at two sizes the mask's link to the keys may not be told from chance
        above = ceiling - max(sizes)
        for other in groups:
            offsets = {b - a for a, b in zip(sizes, other, strict=True)}
            if other == sizes or (len(offsets) == 1 and len(set(other)) >= 3):
                raised[other] = max(raised.get(other, 0), above)
    return raised


def _walk_layers(key: GraphKey, visit: Callable[[Mapping[str, Any], str, Any, int], None]) -> None:
    """Call ``visit(attributes, name, value, leaf)`` for each attribute of each data record.

    ``leaf`` is the index, in ``tensor_specs`` order (args, then kwargs), of the next tensor
    leaf at that point: the attribute's own when it is a tensor.
    """
    counter = [0]

    def walk(sig: Any) -> None:
        if isinstance(sig, TensorSpec):
            counter[0] += 1
            return
        if not isinstance(sig, tuple) or (len(sig) == 3 and sig[0] in ("const", "object")):
            return
        if len(sig) == 3 and sig[0] == "data" and isinstance(sig[2], tuple):
            pairs = [a for a in sig[2] if isinstance(a, tuple) and len(a) == 2]
            attributes = dict(pairs)
            for name, value in pairs:
                visit(attributes, name, value, counter[0])
                walk(value)
            return
        for part in sig:
            walk(part)

    walk(key.args)
    walk(key.kwargs)


MIRRORED_POSITION = ("const", "derived", str(Derived("axis", "keys[-2]")))
"""How a key holds a dynamic layer's position that its keys' length repeats."""
NOT_RECORDING = ("const", "bool", False)
"""A sliding-window layer's ``record_past`` when it keeps ``window - 1`` positions at most."""


def _window_ceiling(attributes: Mapping[str, Any]) -> int | None:
    """``window - 1`` for a dynamic sliding-window layer whose position is its keys' length."""
    window = attributes.get("sliding_window")
    if not (isinstance(window, tuple) and window[:2] == ("const", "int") and window[2] > 1):
        return None
    if attributes.get("record_past", NOT_RECORDING) != NOT_RECORDING:
        return None  # a layer recording its past holds more than the window until cropped
    if not any(attributes.get(name) == MIRRORED_POSITION for name in POSITIONS):
        return None
    return int(window[2]) - 1
