"""tunetree: make PyTorch inference faster without changing what the model computes."""

from __future__ import annotations

from . import backends
from ._version import __version__
from .accuracy import AccuracyBudget, Pareto, PlanStep, Verdict
from .auto import AutoTuneResult, DepthRow, DepthStatus, SkippedWork, auto_tune
from .budget import PhaseTime, TimeBreakdown
from .cache import TuningCache
from .checkpoint import load, save
from .compare import Tolerance, Tolerances
from .errors import (
    BackendError,
    BackendUnavailableError,
    CacheError,
    CheckpointError,
    IncompatibleCheckpointError,
    InvalidInputError,
    MissingDependencyError,
    TunetreeError,
    UntrustedConfigError,
)
from .evaluate import CandidateRow, Status
from .graph import Dim, Graph, GraphKey, Sample
from .inspection import ModelInfo, ModuleRecord, inspect
from .measure import MeasureConfig, Timing, measure
from .plan import Plan, PlanEntry
from .shapes import rebatch
from .strategy import (
    FirstWinsStrategy,
    HighestThroughputStrategy,
    LatencyBudgetStrategy,
    MinLatencyStrategy,
    OneBackendStrategy,
    Strategy,
    accuracy_strategy,
    default_strategy,
    quick_strategy,
)
from .tune import GraphResult, TuneResult, tune
from .wrap import unwrap

__all__ = [
    "AccuracyBudget",
    "AutoTuneResult",
    "BackendError",
    "BackendUnavailableError",
    "CacheError",
    "CandidateRow",
    "CheckpointError",
    "DepthRow",
    "DepthStatus",
    "Dim",
    "FirstWinsStrategy",
    "Graph",
    "GraphKey",
    "GraphResult",
    "HighestThroughputStrategy",
    "IncompatibleCheckpointError",
    "InvalidInputError",
    "LatencyBudgetStrategy",
    "MeasureConfig",
    "MinLatencyStrategy",
    "MissingDependencyError",
    "ModelInfo",
    "ModuleRecord",
    "OneBackendStrategy",
    "Pareto",
    "PhaseTime",
    "Plan",
    "PlanEntry",
    "PlanStep",
    "Sample",
    "SkippedWork",
    "Status",
    "Strategy",
    "TimeBreakdown",
    "Timing",
    "Tolerance",
    "Tolerances",
    "TuneResult",
    "TunetreeError",
    "TuningCache",
    "UntrustedConfigError",
    "Verdict",
    "__version__",
    "accuracy_strategy",
    "auto_tune",
    "backends",
    "default_strategy",
    "inspect",
    "load",
    "measure",
    "quick_strategy",
    "rebatch",
    "save",
    "tune",
    "unwrap",
]
