"""Objects that carry state from call to call (a model's cache objects), as tunetree sees them.

Which objects carry state, how their tensors, positions and capacities are read and how a
fresh one is readied before a call is :mod:`tunetree.hf`'s knowledge (transformers' cache
classes, recognised without importing transformers). The dispatcher (:mod:`tunetree.runtime`)
asks through the :class:`CallState` protocol, and backends through the functions here: no
module outside :mod:`tunetree.hf`, :mod:`tunetree.generation` and :mod:`tunetree.signature`
imports :mod:`tunetree.hf`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..hf import (
    FreshStaticCaches,
    cache_objects,
    capacity_of,
    carried_carrier,
    carrying_positions,
    is_cache_object,
    nested_cache_objects,
    positions_of,
    spec_holds_state,
    to_data,
    updated_in_place,
)

__all__ = [
    "CallState",
    "cache_objects",
    "call_state",
    "capacity_of",
    "carried_carrier",
    "carrying_positions",
    "is_cache_object",
    "nested_cache_objects",
    "positions_of",
    "spec_holds_state",
    "to_data",
    "updated_in_place",
]


class CallState(Protocol):
    """What a dispatcher asks of the state objects a call passes, before the call is keyed.

    One per dispatcher: it may learn from the calls it sees (what readying an object takes).
    """

    def prepare(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool | None:
        """Ready the call's state objects in place so that the call is keyed as tuned.

        Returns:
            None when there was nothing to ready; True when they were readied (the call's
            signature changed: it is keyed again); False when they cannot be readied yet: the
            call then runs the original forward and :meth:`learn` sees it.
        """

    def learn(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], output: Any) -> None:
        """Learn from a call the original forward served (its arguments and output)."""


def call_state() -> CallState:
    """A new :class:`CallState` for one dispatcher: transformers' static cache layers."""
    return FreshStaticCaches()
