"""Static cache layers initialised before a call, so that a prefill looks like every other step.

A static cache layer (transformers' ``StaticLayer`` and ``StaticSlidingWindowLayer``) allocates
its key and value tensors in the first call that writes to it: until then it holds no tensors and
its capacity is a plain int. The first prefill of a fresh cache therefore has another structure
than a call on an initialised cache, and each capacity is a graph of its own, since no tensor's
axis carries it (``generate`` makes a fresh cache per call, so an unseen prompt's prefill
would run the original forward).

:class:`StaticLayers` learns, per layer, what the layer's first write would allocate (head count,
key and value head sizes, dtype, device) from layers it has seen initialised, and then gives a
fresh cache's layers their zero tensors before the call, for the call's batch, exactly as the
layer's own lazy initialisation would (``Cache.early_initialization`` does the same with sizes
given by the caller). Numbers do not change: the layer's first write finds the same zeros.
Layers of other classes, and layers whose sizes were never seen, are left alone.

Nothing here imports ``transformers``; layers are recognised by class name and attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .caches import cache_objects, is_cache_object, nested_cache_objects

STATIC_LAYER_CLASSES = frozenset({"StaticLayer", "StaticSlidingWindowLayer"})
"""Layer classes whose lazy initialisation only allocates zeros of the first write's sizes."""

BATCH_INPUTS = ("input_ids", "inputs_embeds", "decoder_input_ids", "decoder_inputs_embeds")
"""Keyword inputs whose first axis is the call's batch (the cache's batch)."""


@dataclass(frozen=True)
class LayerSizes:
    """What one static layer's lazy initialisation allocates, apart from batch and capacity."""

    cls: type
    num_heads: int
    k_head_dim: int
    v_head_dim: int
    dtype: torch.dtype
    device: torch.device

    def initialise(self, layer: Any, batch: int) -> None:
        """Give ``layer`` its zero tensors, as its first write would."""
        shape = (batch, self.num_heads, 0)
        keys = torch.zeros((*shape, self.k_head_dim), dtype=self.dtype, device=self.device)
        values = torch.zeros((*shape, self.v_head_dim), dtype=self.dtype, device=self.device)
        layer.lazy_initialization(keys, values)


def _is_static_layer(obj: Any) -> bool:
    return type(obj).__name__ in STATIC_LAYER_CLASSES and isinstance(
        vars(obj).get("max_cache_len"), int
    )


def _sizes_of(layer: Any) -> LayerSizes | None:
    """The sizes of an initialised static layer, or None."""
    keys, values = vars(layer).get("keys"), vars(layer).get("values")
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        return None
    if keys.dim() != 4 or values.dim() != 4 or keys.dtype != values.dtype:
        return None
    return LayerSizes(
        type(layer), int(keys.shape[1]), int(keys.shape[-1]), int(values.shape[-1]),
        keys.dtype, keys.device,
    )  # fmt: skip


def _caches(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Iterator[Any]:
    """The cache objects passed directly as arguments (where models take them)."""
    for value in (*args, *kwargs.values()):
        if is_cache_object(value):
            yield value


def _holds_fresh_layer(cache: Any) -> bool:
    """A quick look (once per call of a tuned module) whether ``cache`` has a fresh layer."""
    attributes = vars(cache)
    layers = attributes.get("layers")
    if isinstance(layers, list):
        return any(not vars(layer).get("is_initialized", True) for layer in layers)
    return any(is_cache_object(v) and _holds_fresh_layer(v) for v in attributes.values())


def batch_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int | None:
    """The call's batch: axis 0 of its token or embedding input, passed by name or first.

    None when the call has neither (its fresh layers are then left to initialise themselves).
    """
    for name in BATCH_INPUTS:
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return int(value.shape[0])
    first = args[0] if args else None
    if isinstance(first, torch.Tensor) and first.dim() >= 2:
        return int(first.shape[0])
    return None


class StaticLayers:
    """Learns static cache layers' sizes and initialises fresh layers before a call.

    A layer is told apart by its cache's class and its place among that cache's objects
    (:func:`~.caches.nested_cache_objects`: a fixed order for one cache structure).
    """

    def __init__(self) -> None:
        self.sizes: dict[tuple[type, int], LayerSizes] = {}

    def learn(self, tree: Any) -> None:
        """Remember the sizes of every initialised static layer of the caches in ``tree``."""
        for cache in cache_objects(tree):
            for place, obj in enumerate(nested_cache_objects(cache)):
                if _is_static_layer(obj) and vars(obj).get("is_initialized"):
                    sizes = _sizes_of(obj)
                    if sizes is not None:
                        self.sizes[(type(cache), place)] = sizes

    def uninitialised(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> list[tuple[tuple[type, int], Any]]:
        """``((cache class, place), layer)`` of each fresh static layer in the call's caches."""
        fresh = []
        for cache in _caches(args, kwargs):
            if not _holds_fresh_layer(cache):
                continue
            for place, obj in enumerate(nested_cache_objects(cache)):
                if _is_static_layer(obj) and not vars(obj).get("is_initialized", True):
                    fresh.append(((type(cache), place), obj))
        return fresh

    def initialise(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any], batch: int | None = None
    ) -> bool:
        """Initialise the call's fresh static layers; False when some stay fresh.

        All or none: layers are initialised only when every fresh layer's sizes are known and
        the call's batch is (``batch``, else :func:`batch_of` the call).
        """
        return self.initialise_fresh(self.uninitialised(args, kwargs), args, kwargs, batch)

    def initialise_fresh(
        self,
        fresh: list[tuple[tuple[type, int], Any]],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        batch: int | None = None,
    ) -> bool:
        """:meth:`initialise` for the fresh layers :meth:`uninitialised` found in the call."""
        if not fresh:
            return True
        batch = batch if batch is not None else batch_of(args, kwargs)
        known = [(self.sizes.get(place), layer) for place, layer in fresh]
        if batch is None or any(s is None or s.cls is not type(layer) for s, layer in known):
            return False
        for sizes, layer in known:
            assert sizes is not None
            sizes.initialise(layer, batch)
        return True


class FreshStaticCaches:
    """Fresh static cache layers readied before a call is keyed (a dispatcher's call state).

    Implements :class:`tunetree.signature.stateful.CallState`: a call on a fresh cache whose
    layers' sizes are known gets them initialised first (its prefill is then keyed like the
    tuning's); one whose sizes are not known yet runs the original forward once, and the
    sizes are learned from it.
    """

    def __init__(self) -> None:
        self.layers = StaticLayers()

    def prepare(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool | None:
        """Initialise the call's fresh static layers; see ``CallState.prepare``."""
        fresh = self.layers.uninitialised(args, kwargs)
        if not fresh:
            return None
        return self.layers.initialise_fresh(fresh, args, kwargs)

    def learn(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], output: Any) -> None:
        """Learn the static layers' sizes from a call the original forward served."""
        self.layers.learn((args, kwargs, output))
