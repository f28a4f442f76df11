"""Dtype conversion for backends whose runtimes exchange numpy arrays (OpenVINO, ONNX Runtime).

Stable dtype names for saved runners, and tensors to and from numpy without copies where
possible.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from ..errors import BackendError
from ..signature.graph import dtype_name

_DTYPES: dict[str, torch.dtype] = {
    str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, torch.dtype)
}
_SHORT_DTYPES: dict[str, torch.dtype] = {dtype_name(v): v for v in _DTYPES.values()}


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``"float32"``), as :func:`dtype_to_name` wrote it."""
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise BackendError(f"unknown dtype {name!r} in a saved runner record")
    return dtype


def dtype_to_name(dtype: torch.dtype) -> str:
    """The stable name of ``dtype`` for saved runner records (``"float32"``)."""
    return str(dtype).removeprefix("torch.")


def dtype_from_short_name(name: str) -> torch.dtype | None:
    """The torch dtype a graph signature calls ``name``, or None when there is none.

    Names are like ``"f32"`` (see :func:`tunetree.signature.graph.dtype_name`).
    """
    return _SHORT_DTYPES.get(name)


def numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    """The numpy dtype holding ``dtype``; BackendError where numpy has none (bfloat16)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError as exc:
        raise BackendError(
            f"{dtype_to_name(dtype)} tensors cannot be passed through numpy; this backend "
            "needs graph inputs and outputs of numpy-compatible dtypes (cast the model or "
            "use another backend)"
        ) from exc


def check_numpy_dtypes(dtypes: Iterable[torch.dtype]) -> None:
    """Refuse dtypes that cannot cross numpy (bfloat16): BackendError, see :func:`numpy_dtype`."""
    for dtype in dtypes:
        numpy_dtype(dtype)


def carries(declared: Any, dtype: torch.dtype, *, exact: bool) -> bool:
    """Whether an artifact's declared element type (a numpy dtype or its name) fits ``dtype``.

    An input's must be the very type; an output's one of the same kind (integer, float,
    bool), since :func:`as_torch` converts widths.
    """
    want, got = numpy_dtype(dtype), np.dtype(declared)
    return got == want if exact else got.kind == want.kind


def as_numpy(tensor: torch.Tensor) -> np.ndarray[Any, Any]:
    """A C-contiguous numpy view of ``tensor``.

    A copy only when it is not on the CPU or not contiguous.
    """
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    return tensor.contiguous().numpy()


def as_torch(array: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A numpy result as a tensor of ``dtype`` on ``device``, without a copy where possible."""
    tensor = torch.from_numpy(np.asarray(array))
    if tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    if device.type != "cpu":
        tensor = tensor.to(device)
    return tensor
