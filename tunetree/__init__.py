"""tunetree: make PyTorch inference faster without changing what the model computes.

The names below are the public API, the ones the README and docs use. Everything else stays
importable from its subpackage (``tunetree.signature.graph.GraphKey``,
``tunetree.candidates.measure.measure``, ...) without being part of this list; the names this
package used to re-export still resolve for one release, with a ``DeprecationWarning`` naming
their new import path.
"""

from __future__ import annotations

from . import backends, fleet
from ._util.deprecation import Moved, moved_names
from ._version import __version__ as __version__
from .accuracy import AccuracyBudget
from .cache import TuningCache
from .candidates.budget import TimeBreakdown
from .candidates.measure import MeasureConfig
from .candidates.strategy import (
    FirstWinsStrategy,
    HighestThroughputStrategy,
    LatencyTargetStrategy,
    MinLatencyStrategy,
    OneBackendStrategy,
    Strategy,
    accuracy_strategy,
    default_strategy,
    quick_strategy,
)
from .checkpoint import save
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
from .generation.loading import load
from .live import jit
from .pretrained import load_pretrained
from .runtime.wrap import serve_alone, unwrap
from .search.auto import auto_tune
from .search.auto_result import AutoTuneResult
from .search.config import TuneConfig
from .search.tune import TuneResult, tune
from .signature.compare import Tolerance, Tolerances
from .signature.graph import Dim
from .signature.inspection import ModelInfo, inspect
from .signature.shapes import rebatch

__all__ = [
    "AccuracyBudget",
    "AutoTuneResult",
    "BackendError",
    "BackendUnavailableError",
    "CacheError",
    "CheckpointError",
    "Dim",
    "FirstWinsStrategy",
    "HighestThroughputStrategy",
    "IncompatibleCheckpointError",
    "InvalidInputError",
    "LatencyTargetStrategy",
    "MeasureConfig",
    "MinLatencyStrategy",
    "MissingDependencyError",
    "ModelInfo",
    "OneBackendStrategy",
    "Strategy",
    "TimeBreakdown",
    "Tolerance",
    "Tolerances",
    "TuneConfig",
    "TuneResult",
    "TunetreeError",
    "TuningCache",
    "UntrustedConfigError",
    "accuracy_strategy",
    "auto_tune",
    "backends",
    "default_strategy",
    "fleet",
    "inspect",
    "jit",
    "load",
    "load_pretrained",
    "quick_strategy",
    "rebatch",
    "save",
    "serve_alone",
    "tune",
    "unwrap",
]

_MOVED = {
    "CandidateRow": Moved("tunetree.candidates.evaluate"),
    "DepthRow": Moved("tunetree.search.auto_result"),
    "DepthStatus": Moved("tunetree.search.auto_result"),
    "Graph": Moved("tunetree.signature.graph"),
    "GraphKey": Moved("tunetree.signature.graph"),
    "GraphResult": Moved("tunetree.candidates.results"),
    "LatencyBudgetStrategy": Moved(
        "tunetree.candidates.strategy", use="`tunetree.LatencyTargetStrategy(target_ms, backends)`"
    ),
    "ModuleRecord": Moved("tunetree.signature.inspection"),
    "Pareto": Moved("tunetree.accuracy"),
    "PhaseTime": Moved("tunetree.candidates.budget"),
    "Plan": Moved("tunetree.runtime.plan"),
    "PlanEntry": Moved("tunetree.runtime.plan"),
    "PlanStep": Moved("tunetree.accuracy"),
    "Sample": Moved("tunetree.signature.graph"),
    "SkippedWork": Moved("tunetree.search.auto_result"),
    "Status": Moved("tunetree.candidates.evaluate"),
    "Timing": Moved("tunetree.candidates.measure"),
    "Verdict": Moved("tunetree.accuracy"),
    "measure": Moved("tunetree.candidates.measure"),
}
"""Names this package exported before its API was narrowed, and where they live now."""

__getattr__ = moved_names("tunetree", _MOVED)
