"""tunetree: make PyTorch inference faster without changing what the model computes."""

from __future__ import annotations

from . import backends, fleet
from ._version import __version__
from .accuracy import AccuracyBudget, Pareto, PlanStep, Verdict
from .cache import TuningCache
from .candidates.budget import PhaseTime, TimeBreakdown
from .candidates.evaluate import CandidateRow, Status
from .candidates.measure import MeasureConfig, Timing, measure
from .candidates.strategy import (
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
from .checkpoint import load, save
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
from .live import jit
from .runtime.plan import Plan, PlanEntry
from .runtime.wrap import serve_alone, unwrap
from .search.auto import auto_tune
from .search.auto_result import AutoTuneResult, DepthRow, DepthStatus, SkippedWork
from .search.tune import GraphResult, TuneResult, tune
from .signature.compare import Tolerance, Tolerances
from .signature.graph import Dim, Graph, GraphKey, Sample
from .signature.inspection import ModelInfo, ModuleRecord, inspect
from .signature.shapes import rebatch

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
    "fleet",
    "inspect",
    "jit",
    "load",
    "measure",
    "quick_strategy",
    "rebatch",
    "save",
    "serve_alone",
    "tune",
    "unwrap",
]
