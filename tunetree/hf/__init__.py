"""Hugging Face conventions that tunetree handles as data: cache objects in inputs and outputs.

Nothing here imports ``transformers``: objects are recognised by their classes, so a model
that does not use transformers pays nothing. Only :mod:`tunetree.signature` and
:mod:`tunetree.generation` import this room; the dispatcher and the backends see it through
:mod:`tunetree.signature.stateful` (:class:`FreshStaticCaches` is the dispatcher's call state).
"""

from __future__ import annotations

from .caches import (
    CACHE_CLASSES_MODULE,
    INERT_CACHE_CLASSES,
    MAX_CACHE_ATTRIBUTES,
    ObjectState,
    cache_objects,
    carried_carrier,
    check_attribute_name,
    config_size_limit,
    contains_cache,
    from_data,
    inert_cache_class,
    is_cache_object,
    loaded_cache_class,
    nested_cache_objects,
    spec_holds_state,
    to_data,
    updated_in_place,
)
from .positions import (
    BELOW_CAPACITY,
    CARRIER_DTYPE,
    POSITIONS,
    Derived,
    capacity_of,
    carried_value,
    carrying_positions,
    derived_value,
    is_position_carrier,
    key_value,
    positions_of,
)
from .static_init import FreshStaticCaches, StaticLayers, batch_of

__all__ = [
    "BELOW_CAPACITY",
    "CACHE_CLASSES_MODULE",
    "CARRIER_DTYPE",
    "INERT_CACHE_CLASSES",
    "MAX_CACHE_ATTRIBUTES",
    "POSITIONS",
    "Derived",
    "FreshStaticCaches",
    "ObjectState",
    "StaticLayers",
    "batch_of",
    "cache_objects",
    "capacity_of",
    "carried_carrier",
    "carried_value",
    "carrying_positions",
    "check_attribute_name",
    "config_size_limit",
    "contains_cache",
    "derived_value",
    "from_data",
    "inert_cache_class",
    "is_cache_object",
    "is_position_carrier",
    "key_value",
    "loaded_cache_class",
    "nested_cache_objects",
    "positions_of",
    "spec_holds_state",
    "to_data",
    "updated_in_place",
]
