"""Hugging Face conventions that tunetree handles as data: cache objects in inputs and outputs.

Nothing here imports ``transformers``: objects are recognised by their classes, so a model
that does not use transformers pays nothing.
"""

from __future__ import annotations

from .caches import (
    CACHE_CLASSES_MODULE,
    INERT_CACHE_CLASSES,
    MAX_CACHE_ATTRIBUTES,
    ObjectState,
    cache_objects,
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
from .positions import BELOW_CAPACITY, Derived, capacity_of, key_value, positions_of
from .static_init import StaticLayers, batch_of

__all__ = [
    "BELOW_CAPACITY",
    "CACHE_CLASSES_MODULE",
    "INERT_CACHE_CLASSES",
    "MAX_CACHE_ATTRIBUTES",
    "Derived",
    "ObjectState",
    "StaticLayers",
    "batch_of",
    "cache_objects",
    "capacity_of",
    "check_attribute_name",
    "config_size_limit",
    "contains_cache",
    "from_data",
    "inert_cache_class",
    "is_cache_object",
    "key_value",
    "loaded_cache_class",
    "nested_cache_objects",
    "positions_of",
    "spec_holds_state",
    "to_data",
    "updated_in_place",
]
