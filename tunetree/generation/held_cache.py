"""A Hugging Face cache whose tensors a runtime holds, read back only when asked for.

A stateful runner keeps the KV cache inside its infer request; the ``DynamicCache`` that
``generate`` passes from step to step must still tell the truth. Each of its layers becomes a
*held* layer (its class swapped for a subclass of its own class, every attribute kept): its
length comes from the runner's count, and the first read of ``keys`` or ``values`` of any
layer copies the runtime's state into every layer of that cache, after which the cache is an
ordinary one again. ``generate``'s loop asks only for the length, so nothing is copied per
token; a caller that reads the returned cache, reorders it (beam search) or continues from it
gets the real tensors. The runner copies the state out before it drops it (a new prefill, or
another cache loaded), so a cache never points at state that is gone. A static cache's layers
get buffers of their capacity, the positions held written at the front and counted.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import BackendError

StateReader = Callable[[], Sequence[torch.Tensor]]
"""Reads the runtime's state: keys and values of every layer, in layer order (copies)."""


class HeldState:
    """What every held layer of one cache shares: the length and how to read the tensors."""

    def __init__(self, layers: Sequence[Any], length: int, read: StateReader) -> None:
        # Weak: the layers hold this state, so strong references both ways would be a cycle
        # that keeps a finished generate's cache alive (and copied out) until a collection.
        self.layers = [weakref.ref(layer) for layer in layers]
        self.length = length
        self.read: StateReader | None = read

    @property
    def held(self) -> bool:
        """Whether the runtime still holds the tensors (not yet read back)."""
        return self.read is not None

    def materialise(self) -> None:
        """Copy the runtime's state into every layer; the layers are ordinary ones after."""
        read, self.read = self.read, None
        if read is None:
            return
        layers = [ref() for ref in self.layers]
        if any(layer is None for layer in layers):
            return  # the cache is gone: nobody can read it
        tensors = list(read())
        if len(tensors) != 2 * len(layers):
            raise BackendError(
                f"the runtime holds {len(tensors)} cache tensors, the cache {len(layers)} "
                "layers of keys and values"
            )
        for i, layer in enumerate(alive for alive in layers if alive is not None):
            keys, values = tensors[2 * i], tensors[2 * i + 1]
            if keys.shape[-2] != self.length:
                raise BackendError(
                    f"the runtime holds {keys.shape[-2]} positions, the cache says {self.length}"
                )
            if hasattr(layer, "max_cache_len"):
                keys, values = _in_capacity(layer, keys, values, self.length)
            elif hasattr(layer, "cumulative_length"):
                layer.cumulative_length = self.length
            layer.__dict__["_keys"], layer.__dict__["_values"] = keys, values
            layer.__dict__["_held"] = None


def _in_capacity(
    layer: Any, keys: torch.Tensor, values: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A static layer's buffers of its capacity, ``length`` positions written, its count set.

    Written here rather than by the layer's ``lazy_initialization``, which marks its buffers
    as static addresses for Dynamo: reading a cache back must not import the compiler.
    """
    capacity = int(layer.max_cache_len)
    if length > capacity:
        raise BackendError(f"the runtime holds {length} positions, the static cache {capacity}")
    buffers = []
    for tensor in (keys, values):
        buffer = tensor.new_zeros((*tensor.shape[:-2], capacity, tensor.shape[-1]))
        buffer[..., :length, :] = tensor
        buffers.append(buffer)
    layer.cumulative_length = torch.tensor(length, dtype=torch.long)
    layer.batch_size, layer.num_heads = int(keys.shape[0]), int(keys.shape[1])
    layer.k_head_dim, layer.v_head_dim = int(keys.shape[-1]), int(values.shape[-1])
    return buffers[0], buffers[1]


class _HeldMixin:
    """Keys and values read from the runtime on first use (see the module's docstring)."""

    __slots__ = ()  # the same layout as the layer class it joins, so a layer can switch
    _layer_type = None  # never registered in transformers' layer-type mappings

    def _held_state(self) -> HeldState | None:
        state = self.__dict__.get("_held")
        return state if state is not None and state.held else None

    @property
    def keys(self) -> Any:
        state = self._held_state()
        if state is not None:
            state.materialise()
        return self.__dict__.get("_keys")

    @keys.setter
    def keys(self, value: Any) -> None:
        state = self._held_state()
        if state is not None:
            state.materialise()
        self.__dict__["_keys"] = value

    @property
    def values(self) -> Any:
        state = self._held_state()
        if state is not None:
            state.materialise()
        return self.__dict__.get("_values")

    @values.setter
    def values(self, value: Any) -> None:
        state = self._held_state()
        if state is not None:
            state.materialise()
        self.__dict__["_values"] = value

    @property
    def cumulative_length(self) -> Any:
        """Positions written: the runtime's count while it holds them (a tensor if static)."""
        if "cumulative_length" not in self.__dict__:
            raise AttributeError("cumulative_length")  # a layer class without the count
        state = self._held_state()
        if state is None:
            return self.__dict__["cumulative_length"]
        if hasattr(self, "max_cache_len"):
            return torch.tensor(state.length, dtype=torch.long)
        return state.length

    @cumulative_length.setter
    def cumulative_length(self, value: Any) -> None:
        self.__dict__["cumulative_length"] = value

    def get_seq_length(self) -> int:
        state = self._held_state()
        if state is not None:
            return state.length
        return type(self).__mro__[1].get_seq_length(self)  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=16)
def held_class(base: Any) -> type:
    """The held subclass of one cache layer class (made once per class)."""
    # The methods are copied, not inherited: a class with only ``base`` above it and no
    # slots of its own has ``base``'s memory layout, which a ``__class__`` switch needs.
    methods = {
        name: value
        for name, value in vars(_HeldMixin).items()
        if not name.startswith("__") or name == "__slots__"
    }
    return type(f"Held{base.__name__}", (base,), {**methods, "__module__": __name__})


def hold(cache: Any, length: int, read: StateReader, dtype: torch.dtype) -> HeldState:
    """Make every layer of ``cache`` a held layer of ``length`` positions; returns their state."""
    layers = list(cache.layers)
    state = HeldState(layers, length, read)
    for layer in layers:
        base: Any = type(layer)
        if "_held_state" not in vars(base):
            saved = {name: layer.__dict__.pop(name, None) for name in ("keys", "values")}
            layer.__class__ = held_class(base)
            layer.__dict__["_keys"], layer.__dict__["_values"] = saved["keys"], saved["values"]
        layer.__dict__["_held"] = state
        layer.is_initialized = True
        layer.dtype, layer.device = dtype, torch.device("cpu")
    return state


def held_state_of(cache: Any) -> HeldState | None:
    """The state a cache's layers share while the runtime holds it, else None."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    state = layers[0].__dict__.get("_held")
    if state is None or not state.held or any(x.__dict__.get("_held") is not state for x in layers):
        return None
    return state


class Holder:
    """The one cache a runner's state belongs to, tracked weakly (a dead cache costs nothing)."""

    def __init__(self) -> None:
        self._state: weakref.ref[HeldState] | None = None

    def current(self) -> HeldState | None:
        """The live held state, if any."""
        state = self._state() if self._state is not None else None
        return state if state is not None and state.held else None

    def set(self, state: HeldState | None) -> None:
        """Track ``state`` (weakly) as the one the runtime's state belongs to."""
        self._state = weakref.ref(state) if state is not None else None

    def release(self) -> None:
        """Copy the state out into its cache (if that cache is alive) before the state changes."""
        state = self.current()
        if state is not None:
            state.materialise()
        self._state = None
