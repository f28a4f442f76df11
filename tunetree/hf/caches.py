"""Cache objects (``DynamicCache``, ``EncoderDecoderCache``, their layers) as plain data.

A Hugging Face model returns its key/value cache as an object, not as tensors in a
container, and a decode step receives one. torch's pytree treats such an object as one
opaque leaf, so comparing two outputs would compare objects by identity, and cloning a
recorded call would share the cache that every run then mutates.

:func:`to_data` replaces each cache object in a nested structure by an :class:`ObjectState`
node holding its class, its constant attributes (ints, flags, devices) and its data
attributes (tensors, nested caches and containers of them); :func:`from_data` builds new
objects of the same classes back. ``ObjectState`` is a pytree node of tunetree's own, so the
caches' tensors become ordinary leaves for flattening, comparing, cloning and exporting,
and no user type is registered with torch.
"""

from __future__ import annotations

import copy
import functools
import sys
from typing import Any

import torch
import torch.utils._pytree as pytree

from .positions import (
    carried_value,
    mirrored_names,
    mirrored_sizes,
    position_carrier,
)

_CACHE_BASES = frozenset(
    {
        "Cache",
        "CacheLayerMixin",
        "EncoderDecoderCache",
        # transformers 5: the recurrent (SSM, conv) state of Mamba, Mamba2, FalconMamba and
        # the linear-attention layers of hybrids (Jamba, Zamba2, Bamba, Qwen3-Next, LFM2),
        # alone or with a key/value layer (LinearAttentionAndFullAttentionLayer, ...)
        "LinearAttentionCacheLayerMixin",
        # a layer that holds nothing (MoE or MLP-only layers of a hybrid, shared-KV layers)
        "DummyLayer",
    }
)
"""Names of transformers' cache base classes; an object whose class derives from one is data."""


def is_cache_object(value: Any) -> bool:
    """Whether ``value`` is a Hugging Face cache (or cache layer) object.

    Recognised by a class of ``transformers`` in its MRO named like the cache bases, or a
    transformers class whose name ends in ``Cache`` (model-specific caches), so transformers
    is never imported here.
    """
    return not isinstance(value, type) and is_cache_class(type(value))


def is_cache_class(cls: type) -> bool:
    """Whether instances of ``cls`` are cache objects (see :func:`is_cache_object`).

    Answered once per class (a tuned module asks on every call).
    """
    return _is_cache_class(cls)  # type: ignore[arg-type]  # classes are hashable


@functools.lru_cache(maxsize=512)
def _is_cache_class(cls: type) -> bool:
    if not cls.__module__.startswith("transformers"):
        return False
    if cls.__name__.endswith("Cache"):
        return True
    return any(
        base.__name__ in _CACHE_BASES and base.__module__.startswith("transformers")
        for base in cls.__mro__
    )


class ObjectState:
    """A cache object as data: its class, constant attributes and data attributes.

    A pytree node: the data attributes are its children, the class and the constants its
    context (two states compare equal in structure only when both agree). ``mirrored`` names
    the constants that repeat a tensor's size (:mod:`.positions`): a rebuilt object takes them
    from its new tensors, which may be of other sizes (a resized probe, a runner's outputs).
    ``carried`` names the data entries that are position carriers: the rebuilt object's
    attribute is the carrier's length, not the tensor.
    """

    __slots__ = ("carried", "cls", "constants", "data", "mirrored")

    def __init__(
        self,
        cls: type,
        constants: tuple[tuple[str, Any], ...],
        data: dict[str, Any],
        mirrored: tuple[str, ...] = (),
        carried: tuple[str, ...] = (),
    ):
        self.cls = cls
        self.constants = constants
        self.data = data
        self.mirrored = mirrored
        self.carried = carried

    @classmethod
    def of(cls, obj: Any) -> ObjectState:
        """The state of ``obj`` (nested cache objects become states too)."""
        constants = []
        data = {}
        carried = []
        attributes = vars(obj)
        for name, value in sorted(attributes.items()):  # by name: one order for every copy
            carrier = position_carrier(attributes, name)
            if carrier is not None:
                data[name] = carrier
                carried.append(name)
                continue
            converted, holds = _as_data(value)
            if holds:
                data[name] = converted
            else:
                constants.append((name, value))
        return cls(type(obj), tuple(constants), data, mirrored_names(attributes), tuple(carried))

    def with_data(self, data: dict[str, Any]) -> ObjectState:
        """The same state around other data (same names, e.g. resized tensors)."""
        return ObjectState(self.cls, self.constants, data, self.mirrored, self.carried)

    def build(self) -> Any:
        """A new object of the recorded class with these attributes (mutable constants copied)."""
        obj: Any = object.__new__(self.cls)
        for name, value in self.constants:
            obj.__dict__[name] = value if isinstance(value, _IMMUTABLE) else copy.deepcopy(value)
        for name, value in self.data.items():
            obj.__dict__[name] = carried_value(value) if name in self.carried else from_data(value)
        obj.__dict__.update(mirrored_sizes(self.mirrored, obj.__dict__))
        return obj

    def __repr__(self) -> str:
        return f"{self.cls.__name__}({', '.join(self.data)})"


_IMMUTABLE = (type(None), bool, int, float, str, type, torch.device, torch.dtype)
"""Constants a rebuilt cache may share with the original (others are deep-copied)."""


def carried_carrier(obj: Any, name: str) -> Any:
    """The carrier of ``obj``'s position ``name`` where the layer carries it, else the value.

    What :meth:`ObjectState.of` puts in the position's place, for a runner that reads a
    call's inputs by attribute path instead of flattening it.
    """
    carrier = position_carrier(vars(obj), name) if is_cache_object(obj) else None
    return getattr(obj, name) if carrier is None else carrier


def _as_data(value: Any) -> tuple[Any, bool]:
    """``value`` with its cache objects as states, and whether it holds a tensor or a cache.

    One pass over plain containers (what cache attributes hold).
    """
    if isinstance(value, torch.Tensor):
        return value, True
    if is_cache_object(value):
        return ObjectState.of(value), True
    if isinstance(value, tuple | list):
        items = [_as_data(v) for v in value]
        if not any(holds for _, holds in items):
            return value, False
        converted = [v for v, _ in items]
        return (converted if isinstance(value, list) else type(value)(converted)), True
    if isinstance(value, dict):
        pairs = {k: _as_data(v) for k, v in value.items()}
        if not any(holds for _, holds in pairs.values()):
            return value, False
        return {k: v for k, (v, _) in pairs.items()}, True
    return value, False


def _flatten_state(state: ObjectState) -> tuple[list[Any], Any]:
    names = tuple(state.data)
    context = (state.cls, names, state.constants, state.mirrored, state.carried)
    return [state.data[n] for n in names], context


def _unflatten_state(values: Any, context: Any) -> ObjectState:
    cls, names, constants, mirrored, carried = context
    return ObjectState(cls, constants, dict(zip(names, values, strict=True)), mirrored, carried)


def _flatten_state_with_keys(state: ObjectState) -> tuple[list[tuple[Any, Any]], Any]:
    values, context = _flatten_state(state)
    return [(pytree.GetAttrKey(n), v) for n, v in zip(context[1], values, strict=True)], context


pytree.register_pytree_node(
    ObjectState,
    _flatten_state,
    _unflatten_state,
    serialized_type_name="tunetree.hf.caches.ObjectState",
    flatten_with_keys_fn=_flatten_state_with_keys,
)


def contains_cache(tree: Any) -> bool:
    """A quick look whether ``tree`` holds a cache object anywhere (most trees do not)."""
    if is_cache_object(tree):
        return True
    if isinstance(tree, torch.Tensor) or tree is None:
        return False
    return any(is_cache_object(leaf) for leaf in pytree.tree_leaves(tree))


def to_data(tree: Any) -> Any:
    """``tree`` with every cache object replaced by its :class:`ObjectState` (a new tree).

    A tree without cache objects is returned as it is.
    """
    if not contains_cache(tree):
        return tree
    return pytree.tree_map(
        lambda leaf: ObjectState.of(leaf) if is_cache_object(leaf) else leaf,
        tree,
        is_leaf=is_cache_object,
    )


def _is_state(value: Any) -> bool:
    return isinstance(value, ObjectState)


def spec_holds_state(spec: pytree.TreeSpec) -> bool:
    """Whether a tree spec has an :class:`ObjectState` node (a cache object) anywhere."""
    if spec.type is ObjectState:
        return True
    children = getattr(spec, "children", None)  # torch 2.13 deprecates children_specs
    found = children() if callable(children) else spec.children_specs
    return any(spec_holds_state(child) for child in found)


def from_data(tree: Any) -> Any:
    """``tree`` with every :class:`ObjectState` built back into a new cache object."""
    if _is_state(tree):
        return tree.build()
    if isinstance(tree, torch.Tensor) or tree is None:
        return tree
    return pytree.tree_map(
        lambda leaf: leaf.build() if _is_state(leaf) else leaf, tree, is_leaf=_is_state
    )


def nested_cache_objects(tree: Any) -> list[Any]:
    """Every cache object in ``tree``, nested ones (a cache's layers) too, in a fixed order.

    Two trees of one structure list their objects in the same order.
    """
    found: list[Any] = []
    for leaf in pytree.tree_leaves(tree, is_leaf=is_cache_object):
        _walk_caches(leaf, found)
    return found


def _walk_caches(value: Any, found: list[Any]) -> None:
    """Append the cache objects in ``value`` to ``found``, depth first.

    A module-level function, not a closure: a nested function that calls itself is a reference
    cycle, which kept every list it filled (a decode step's whole cache, once per call) alive
    until the cyclic garbage collector ran.
    """
    if is_cache_object(value):
        found.append(value)
        for _, attribute in sorted(vars(value).items()):
            _walk_caches(attribute, found)
    elif isinstance(value, tuple | list):
        for item in value:
            _walk_caches(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _walk_caches(item, found)


def cache_objects(tree: Any) -> list[Any]:
    """The cache objects in ``tree`` (outermost only), in order."""
    return [
        leaf for leaf in pytree.tree_leaves(tree, is_leaf=is_cache_object) if is_cache_object(leaf)
    ]


def updated_in_place(inputs: Any, output: Any) -> Any:
    """``output`` with each rebuilt cache written into the input cache it stands for.

    Hugging Face models update the cache they are given and return that same object. A runner
    that rebuilds its outputs from tensors returns a new cache instead; callers that keep the
    object they passed (``generate`` does) would then not see the new state. Each cache in
    ``output`` whose class matches exactly one input cache becomes that input object, holding
    the new state.
    """
    given: dict[type, list[Any]] = {}
    for cache in cache_objects(inputs):
        given.setdefault(type(cache), []).append(cache)
    if not given:
        return output

    def into_input(leaf: Any) -> Any:
        same = given.get(type(leaf), []) if is_cache_object(leaf) else []
        if len(same) != 1 or same[0] is leaf:
            return leaf
        target = same[0]
        target.__dict__.clear()
        target.__dict__.update(leaf.__dict__)
        return target

    return pytree.tree_map(into_input, output, is_leaf=is_cache_object)


CACHE_CLASSES_MODULE = "transformers.cache_utils"
"""The one module whose cache classes a saved graph key may name."""

INERT_CACHE_CLASSES = frozenset(
    {
        "DynamicCache",
        "StaticCache",
        "SlidingWindowCache",
        "EncoderDecoderCache",
        "DynamicLayer",
        "DynamicSlidingWindowLayer",
        "DynamicIndexedLayer",
        "StaticLayer",
        "StaticSlidingWindowLayer",
        "StaticIndexedLayer",
        "LinearAttentionLayer",
        "LinearAttentionAndFullAttentionLayer",
        "LinearAttentionAndSlidingWindowAttentionLayer",
        "LinearAttentionAndStaticFullAttentionLayer",
        "LinearAttentionAndStaticSlidingWindowAttentionLayer",
    }
)
"""Cache classes a graph key read from a file may name: transformers' plain
containers of tensors, whose methods only index, concatenate and allocate with torch. Anything
else is refused: a quantized layer (``QuantoQuantizedLayer``'s ``update`` imports its
quantization package, found on ``sys.path``), a model's own cache class, or a class a file
names for any other reason. A name missing from the installed transformers is refused too."""

MAX_CACHE_ATTRIBUTES = 64
"""Most attributes one saved cache object may have."""


def inert_cache_class(name: Any) -> type | None:
    """The allow-listed cache class called ``name``, or None (:data:`INERT_CACHE_CLASSES`).

    Looked up in transformers' cache module only if the user's process has imported it
    already: nothing is imported here, and no module a file names is searched.
    """
    if not isinstance(name, str) or name not in INERT_CACHE_CLASSES:
        return None
    module = sys.modules.get(CACHE_CLASSES_MODULE)
    cls = getattr(module, name, None) if module is not None else None
    if (
        not isinstance(cls, type)
        or cls.__module__ != CACHE_CLASSES_MODULE
        or cls.__qualname__ != name
        or not is_cache_class(cls)
    ):
        return None
    return cls


def loaded_cache_class(name: str) -> type | None:
    """The cache class a saved signature names, from the fixed list only; None for others.

    Kept for callers of the first name; see :func:`inert_cache_class`.
    """
    return inert_cache_class(name)


def check_attribute_name(name: Any) -> str:
    """A saved cache attribute's name: a short identifier, never a dunder (ValueError)."""
    if not isinstance(name, str) or not name.isidentifier() or len(name) > 64:
        raise ValueError(f"a cache attribute name must be a short identifier, not {name!r:.60}")
    if name.startswith("__"):
        raise ValueError(f"a cache attribute may not be named {name!r:.60}")
    return name


def config_size_limit(module: Any) -> int | None:
    """The largest sequence size a Hugging Face model's config declares, or None.

    Sizes a saved cache object states (``max_cache_len``, ``sliding_window``) are bounded by
    this and by the graph's own tensors, never by the file alone.
    """
    config = getattr(module, "config", None)
    if config is None:
        return None
    found = []
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "sliding_window"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            found.append(value)
    return max(found) if found else None
