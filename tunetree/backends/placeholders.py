"""Placeholder calls rebuilt from a graph key alone, for runners that must capture again.

A captured device graph holds device addresses and cannot be saved; a loaded runner captures
again from a call that has the key's signature, made of placeholder tensors (ones for floats,
zeros for integers and booleans) and the recorded constants.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import BackendError
from ..signature.graph import _DTYPE_SHORT, GraphKey, Sample, TensorSpec

_DTYPE_BY_NAME = {name: dtype for dtype, name in _DTYPE_SHORT.items()}


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = _DTYPE_BY_NAME.get(name) or getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise BackendError(f"unknown dtype {name!r} in a graph signature")
    return dtype


def _dummy_value(sig: Any, device: torch.device) -> Any:
    """One argument rebuilt from its signature (see ``graph._leaf_signature``)."""
    if isinstance(sig, TensorSpec):
        dtype = _dtype_from_name(sig.dtype)
        # Floats get ones (no log(0) or 0/0 during warm-up); integers and booleans get zeros,
        # which are valid token ids, indices and masks.
        fill = torch.ones if dtype.is_floating_point or dtype.is_complex else torch.zeros
        return fill(sig.example_shape(), dtype=dtype, device=device)
    if isinstance(sig, tuple) and len(sig) == 3 and sig[0] == "const":
        _, type_name, value = sig
        if type_name == "dtype":
            return _dtype_from_name(str(value).replace("torch.", ""))
        if type_name == "device":
            return torch.device(value)
        if type_name != "enum":  # an enum member is named, and nothing named is imported
            return value
    elif isinstance(sig, tuple) and len(sig) == 2 and sig[0] in ("tuple", "list"):
        items = [_dummy_value(s, device) for s in sig[1]]
        return tuple(items) if sig[0] == "tuple" else items
    elif isinstance(sig, tuple) and len(sig) == 2 and sig[0] == "dict":
        return {k: _dummy_value(v, device) for k, v in sig[1]}
    what = sig[1] if isinstance(sig, tuple) and sig and sig[0] in ("object", "const") else sig[0]
    raise BackendError(
        f"cannot rebuild an input of type {what} from its signature alone; "
        "tune this module again instead of loading the saved runner"
    )


def sample_from_key(key: GraphKey, device: torch.device | str) -> Sample:
    """A call with ``key``'s signature made of placeholder tensors on ``device``.

    Floating-point tensors are ones, integer and boolean tensors zeros (valid token ids and
    indices); constants take their recorded values. Used where a runner must be rebuilt
    without the recorded samples, e.g. when loading a checkpoint. Raises
    :class:`BackendError` for arguments that a signature does not describe fully
    (dataclasses and arbitrary objects).
    """
    device = torch.device(device)
    args = tuple(_dummy_value(sig, device) for sig in key.args)
    kwargs = {name: _dummy_value(sig, device) for name, sig in key.kwargs}
    return Sample(args, kwargs)
