"""tunetree: make PyTorch inference faster without changing what the model computes."""

from __future__ import annotations

from . import backends
from .compare import Tolerance, Tolerances
from .errors import (
    BackendError,
    BackendUnavailableError,
    CacheError,
    CheckpointError,
    IncompatibleCheckpointError,
    InvalidInputError,
    TunetreeError,
)
from .graph import Graph, GraphKey, Sample

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "CacheError",
    "CheckpointError",
    "Graph",
    "GraphKey",
    "IncompatibleCheckpointError",
    "InvalidInputError",
    "Sample",
    "Tolerance",
    "Tolerances",
    "TunetreeError",
    "__version__",
    "backends",
]
