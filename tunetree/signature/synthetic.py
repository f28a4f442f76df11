"""Calls made from a graph key alone, for code that holds a key but no recorded sample.

A checkpoint holds graph keys, not samples: loading learns a saved runner's output structure
by running the module on a call made here, and checks a loaded runner against eager on calls
made here. The key comes from a file, so nothing in it chooses code: tensors are
made by torch, constants are plain values, and a cache object is built only as one of the
allow-listed inert classes (:data:`tunetree.hf.INERT_CACHE_CLASSES`), its attribute names
checked and the sizes it states bounded by the key's own tensors and the model's config. No
method of such an object runs here (it is made with ``object.__new__``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..errors import BackendError
from ..hf import (
    CACHE_CLASSES_MODULE,
    INERT_CACHE_CLASSES,
    MAX_CACHE_ATTRIBUTES,
    POSITIONS,
    carried_value,
    check_attribute_name,
    config_size_limit,
    derived_value,
    inert_cache_class,
    is_position_carrier,
)
from .graph import GraphKey, Sample, TensorSpec

Fill = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]
"""Makes one tensor of a call: its shape, dtype and device."""

_DTYPES = {
    "f32": torch.float32,
    "f64": torch.float64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "i32": torch.int32,
    "i16": torch.int16,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.bool,
}
"""The dtypes a graph key names (:func:`tunetree.signature.graph.dtype_name`)."""
_TORCH_DTYPES = {str(dtype): dtype for dtype in _DTYPES.values()}
_PLAIN = {"NoneType": type(None), "bool": bool, "int": int, "float": float, "str": str}


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Placeholders (what learning an output structure runs on)."""
    return torch.zeros(shape, dtype=dtype, device=device)


def check_values(seed: int = 0) -> Fill:
    """Values for a check call: floats drawn from N(0, 1), integers and flags one.

    Ones are valid token ids, positions and attention masks of any model; the floats are
    what the value probes vary.
    """
    generator = torch.Generator().manual_seed(seed)

    def fill(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if dtype.is_floating_point:
            return torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
        return torch.ones(shape, dtype=dtype, device=device)

    return fill


def size_limit(key: GraphKey, module: Any = None) -> int:
    """The largest size a cache object in ``key`` may state.

    The key's largest axis, or the model's configured sequence length
    (:func:`tunetree.hf.config_size_limit`) when larger.
    """
    axes = [n for spec in key.tensor_specs() for n in spec.example_shape()]
    return max([*axes, config_size_limit(module) or 0, 1])


def check_key_names(key: GraphKey) -> None:
    """Refuse a key naming what no call is made of, without the model or transformers.

    Every cache object must be of a class on the allow-list (by name), its attributes of
    checked names; a ``type`` constant must name an allow-listed class; an opaque object is
    refused. What :func:`call_from_key` refuses by name, so ``tunetree info`` refuses it too;
    sizes are bounded there, where the model's config is known. BackendError.
    """
    for sig in (*key.args, *(sig for _, sig in key.kwargs)):
        _check_names(sig, 0)


def _check_names(sig: Any, depth: int, in_cache: bool = False) -> None:
    if isinstance(sig, TensorSpec) or not isinstance(sig, tuple) or not sig:
        return
    if depth > 64:
        raise BackendError("a saved key is nested deeper than 64 levels")
    kind = sig[0]
    if kind == "const" and len(sig) == 3:
        _check_type_constant(sig)
        if in_cache:
            check_cache_constant(sig[2])
    elif kind == "data" and len(sig) == 3:
        _check_data(sig[1], sig[2], depth)
    elif kind == "object":
        raise BackendError("a saved key holds an opaque object, which no call can be made of")
    elif kind in ("tuple", "list") and len(sig) == 2 and isinstance(sig[1], tuple):
        for item in sig[1]:
            _check_names(item, depth + 1, in_cache)
    elif len(sig) == 2 and isinstance(sig[1], tuple):  # a dict, or a dataclass's fields
        for _, value in _pairs(sig[1]):
            _check_names(value, depth + 1, in_cache)


def check_cache_constant(value: Any) -> None:
    """Refuse a number in a saved cache object that no cache holds (BackendError).

    An int (a size, a capacity, a position, a window) is 0 or more: a cache layer holds
    no negative one, and a module run on one fails (a tensor of a negative size); a float
    is finite. The upper bound of a size needs the model's config and is checked where a
    call is made (:func:`call_from_key`).
    """
    if type(value) is int and value < 0:
        raise BackendError(
            f"a saved cache object states the size {value}: a size or position is 0 or more"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise BackendError("a saved cache object holds a float that is not finite")


def _check_type_constant(sig: tuple[Any, ...]) -> None:
    if sig[1] != "type":
        return
    value = sig[2] if isinstance(sig[2], str) else ""
    module, _, name = value.rpartition(".")
    if name not in INERT_CACHE_CLASSES or module != CACHE_CLASSES_MODULE:
        raise BackendError(
            f"a saved key names the class {value[:80]!r}, not one of transformers' inert "
            "cache classes (tunetree.hf.INERT_CACHE_CLASSES)"
        )


def _check_data(name: Any, attributes: Any, depth: int) -> None:
    if name not in INERT_CACHE_CLASSES:
        raise BackendError(
            f"a saved graph names the cache class {str(name)[:80]!r}, which is not one of "
            "transformers' inert cache classes (tunetree.hf.INERT_CACHE_CLASSES): nothing a "
            "file names is built or run"
        )
    if not isinstance(attributes, tuple) or len(attributes) > MAX_CACHE_ATTRIBUTES:
        raise BackendError(f"a saved {name} holds too many attributes")
    for attribute, value in _pairs(attributes):
        try:
            check_attribute_name(attribute)
        except ValueError as exc:
            raise BackendError(f"a saved {name}: {exc}") from None
        _check_names(value, depth + 1, in_cache=True)
        if attribute in CAPACITIES and value == ("const", "int", 0) and "Static" in name:
            raise BackendError(
                f"a saved {name} states {attribute} 0: a static cache layer holds at least one "
                "position"
            )


CAPACITIES = frozenset({"max_cache_len", "sliding_window"})
"""Static cache layers' sizes: no layer is made with room for no position."""


def call_from_key(
    key: GraphKey, device: torch.device, fill: Fill = zeros, limit: int | None = None
) -> Sample:
    """A call of ``key``: every tensor from ``fill`` at its spec's example shape.

    BackendError for a key no call can be made from: an opaque object, a class outside the
    allow-list, a cache attribute of a bad name or an int above ``limit`` (default
    :func:`size_limit` of the key alone).
    """
    maker = _Maker(device, fill, size_limit(key) if limit is None else limit)
    args = tuple(maker.value(sig) for sig in key.args)
    kwargs = {name: maker.value(sig) for name, sig in key.kwargs}
    return Sample(args, kwargs)


class Fields(dict):  # type: ignore[type-arg]
    """A mapping rebuilt from a key, also read by position as a ``ModelOutput`` is.

    A key records a Hugging Face ``ModelOutput`` (an encoder's output, passed to every
    decoder step of ``generate``) as a mapping of its set fields, and T5, BART, Marian and
    Whisper read an encoder output that is not of that class by position
    (``encoder_outputs[0]``). An int or slice that is not a key of its own reads the values
    in order, as ``ModelOutput.to_tuple()`` does; every other read is a dict's.
    """

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int | slice) and not (isinstance(key, int) and key in self.keys()):
            return tuple(self.values())[key]
        return super().__getitem__(key)


class _Maker:
    def __init__(self, device: torch.device, fill: Fill, limit: int) -> None:
        self.device = device
        self.fill = fill
        self.limit = limit

    def value(self, sig: Any, in_cache: bool = False) -> Any:
        if isinstance(sig, TensorSpec):
            dtype = _DTYPES.get(sig.dtype)
            if dtype is None:
                raise BackendError(f"cannot make an input of dtype {sig.dtype!r:.40}")
            return self.fill(sig.example_shape(), dtype, self.device)
        if not isinstance(sig, tuple) or not sig:
            raise BackendError(f"cannot make an input from {sig!r:.80}")
        kind = sig[0]
        if kind == "const" and len(sig) == 3:
            return self.constant(sig[1], sig[2], in_cache)
        if kind in ("tuple", "list") and len(sig) == 2 and isinstance(sig[1], tuple):
            items = [self.value(s, in_cache) for s in sig[1]]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict" and len(sig) == 2 and isinstance(sig[1], tuple):
            fields = {self.dict_key(k): self.value(v, in_cache) for k, v in _pairs(sig[1])}
            return fields if in_cache else Fields(fields)
        if kind == "data" and len(sig) == 3:
            return self.cache_object(sig[1], sig[2])
        raise BackendError(
            f"cannot make an input from {str(kind)[:40]!r}: only tensors, plain constants, "
            "containers and the allow-listed cache classes are rebuilt from a saved key"
        )

    def dict_key(self, key: Any) -> str | int:
        if type(key) is int and 0 <= key <= MAX_CACHE_ATTRIBUTES:
            return key  # a state's index (a recurrent cache layer's dicts)
        if not isinstance(key, str) or len(key) > 256:
            raise BackendError("a saved key holds a dict key that is not a short string")
        return key

    def constant(self, kind: Any, value: Any, in_cache: bool) -> Any:
        plain = _PLAIN.get(kind) if isinstance(kind, str) else None
        if plain is not None:
            if type(value) is not plain and not (plain is float and type(value) is int):
                raise BackendError(f"a saved {kind} constant holds {type(value).__name__}")
            if in_cache:
                check_cache_constant(value)
            if in_cache and type(value) is int and value > self.limit:
                raise BackendError(
                    f"a saved cache object states the size {value}, over the {self.limit} that "
                    "the graph's tensors and the model's config account for: refused"
                )
            if isinstance(value, str) and len(value) > 256:
                raise BackendError("a saved string constant is longer than 256 characters")
            return value
        if kind == "device" and isinstance(value, str) and len(value) <= 32:
            try:
                return torch.device(value)
            except RuntimeError as exc:
                raise BackendError(f"a saved device {value!r} is not a torch device") from exc
        if kind == "dtype" and value in _TORCH_DTYPES:
            return _TORCH_DTYPES[value]
        if kind == "type" and isinstance(value, str):
            module, _, name = value.rpartition(".")
            cls = inert_cache_class(name)
            if cls is not None and module == cls.__module__:
                return cls
        raise BackendError(f"cannot rebuild a saved constant of kind {str(kind)[:40]!r}")

    def cache_object(self, name: Any, attributes: Any) -> Any:
        cls = inert_cache_class(name)
        if cls is None:
            raise BackendError(
                f"a saved graph names the cache class {str(name)[:80]!r}, which is not one of "
                "transformers' inert cache classes (tunetree.hf.INERT_CACHE_CLASSES) loaded "
                "here: nothing a file names is built or run"
            )
        if not isinstance(attributes, tuple) or len(attributes) > MAX_CACHE_ATTRIBUTES:
            raise BackendError(f"a saved {name} holds too many attributes")
        obj: Any = object.__new__(cls)
        derived: list[tuple[str, str]] = []
        for attribute, sig in _pairs(attributes):
            try:
                check_attribute_name(attribute)
            except ValueError as exc:
                raise BackendError(f"a saved {name}: {exc}") from None
            if isinstance(sig, tuple) and sig[:2] == ("const", "derived") and len(sig) == 3:
                derived.append((attribute, sig[2]))  # once the tensors it names are built
                continue
            value = self.value(sig, in_cache=True)
            if attribute in POSITIONS and is_position_carrier(value):
                value = self.constant("int", int(carried_value(value)), in_cache=True)
            obj.__dict__[attribute] = value
        for attribute, text in derived:
            value = derived_value(obj.__dict__, attribute, text) if isinstance(text, str) else None
            if value is None:
                raise BackendError(
                    f"cannot rebuild a saved cache attribute {attribute!r} from {text!r:.60}"
                )
            obj.__dict__[attribute] = value
        return obj


def _pairs(items: tuple[Any, ...]) -> list[tuple[Any, Any]]:
    if not all(isinstance(item, tuple) and len(item) == 2 for item in items):
        raise BackendError("a saved key holds a mapping that is not a list of pairs")
    return list(items)
