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
from .evaluate import CandidateRow, Status
from .graph import Graph, GraphKey, Sample
from .inspection import ModelInfo, ModuleRecord, inspect
from .measure import MeasureConfig, Timing, measure
from .plan import Plan, PlanEntry
from .strategy import (
    FirstWinsStrategy,
    HighestThroughputStrategy,
    LatencyBudgetStrategy,
    MinLatencyStrategy,
    OneBackendStrategy,
    Strategy,
    default_strategy,
)
from .tune import GraphResult, TuneResult, tune
from .wrap import unwrap

__version__ = "0.1.0"

__all__ = [
    "CandidateRow",
    "FirstWinsStrategy",
    "GraphResult",
    "HighestThroughputStrategy",
    "LatencyBudgetStrategy",
    "MeasureConfig",
    "MinLatencyStrategy",
    "ModelInfo",
    "ModuleRecord",
    "OneBackendStrategy",
    "Plan",
    "PlanEntry",
    "Status",
    "Strategy",
    "Timing",
    "TuneResult",
    "default_strategy",
    "inspect",
    "measure",
    "tune",
    "unwrap",
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
