"""What auto_tune returns: one row per depth, the selected plan, and the tables that explain it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util.plot import figure
from .._util.table import format_seconds, format_table
from ..accuracy.budget import AccuracyBudget
from ..accuracy.pareto import Pareto
from ..accuracy.pareto import steps_table as accuracy_steps_table
from ..accuracy.repair import PlanStep
from ..candidates.budget import (
    TIME_BUDGET_ERROR,
    TimeBreakdown,
)
from ..candidates.measure import Timing
from ..errors import InvalidInputError
from ..generation import GenerationStep, generation_steps, steps_table
from ..generation.multistep_trial import MultiStepTrial
from ..generation.multistep_trial import trials_table as multistep_table
from ..generation.stateful_trial import StatefulTrial, trials_table
from ..runtime.plan import Plan
from ..runtime.wrap import unwrap, wrap
from ..signature.binding import Binder
from ..signature.inspection import ModelInfo
from ..signature.modules import find_module
from .tune import GraphResult

NOISY = "timings too spread to tell apart (busy machine?)"


class DepthStatus(str, enum.Enum):
    """What happened to one depth of an auto-tune (the reason, if any, is in ``DepthRow.error``)."""

    NOT_STARTED = "not started"
    DRY_RUN = "dry run"
    SKIPPED = "skipped"
    SAME_CUT = "same cut"
    SAME_PLAN = "same plan"
    NO_CHANGE = "no change: every graph kept eager"
    REJECTED = "rejected"
    FAILED = "failed"
    MEASURED = "measured"
    REUSED = "depth chosen on a host of the same kind, re-checked here"
    """Measured here beside the untuned model, the other depths not (a recorded decision)."""
    NOT_MEASURED = "not measured"
    RECORDED = "recorded plan, loaded and checked here (not measured)"
    """A plan an earlier tune recorded, served from the cache (:mod:`.recorded`)."""

    def __str__(self) -> str:
        return self.value


@dataclass
class DepthRow:
    """One depth of an auto-tune."""

    depth: int
    modules: int
    graphs: int
    status: DepthStatus = DepthStatus.NOT_STARTED
    timing: Timing | None = None
    speedup: float | None = None
    error: str = ""
    same_as: int | None = None
    untuned: Timing | None = None
    """The untuned model's timing, measured interleaved with this depth's."""
    noisy: bool = False
    """The timings stayed too spread to separate the candidates after a re-measurement."""
    plans: str = ""
    """Both plans' end-to-end latencies when greedy and single-runtime plans differ."""
    steps: list[PlanStep] = field(default_factory=list)
    """Under an accuracy budget: every plan checked at this depth, in repair order."""

    @property
    def chosen_step(self) -> PlanStep | None:
        """Under an accuracy budget: the plan step this depth's timing is of."""
        return next((s for s in self.steps if s.chosen), None)

    @property
    def output_error(self) -> float | None:
        """Under an accuracy budget: the depth's plan's error on the tuning inputs."""
        step = self.chosen_step
        return step.verdict.error if step is not None else None

    @property
    def latency_s(self) -> float | None:
        """Median end-to-end latency at this depth, or None when not measured."""
        return self.timing.median_s if self.timing else None

    @property
    def status_text(self) -> str:
        """The status as the table shows it, with its reason."""
        text = str(self.status)
        if self.status is DepthStatus.SAME_CUT:
            text = f"same cut as depth {self.same_as}"
        elif self.status is DepthStatus.SAME_PLAN:
            text = f"same plan as depth {self.same_as}: not measured again"
        notes = [n for n in (self.error, self.plans, "noisy: " + NOISY if self.noisy else "") if n]
        return text + (f": {'; '.join(notes)}" if notes else "")


@dataclass(frozen=True)
class SkippedWork:
    """Work the time budget skipped: a whole depth, a candidate's build or its measurement."""

    depth: int
    what: str
    """``depth``, ``build`` (not started) or ``measurement`` (built, not measured)."""
    path: str = ""
    graph: str = ""
    backend: str = ""
    reason: str = TIME_BUDGET_ERROR


@dataclass
class AutoTuneResult:
    """What :func:`auto_tune` did; ``print()`` it for the table of depths.

    Attributes:
        model: The thing to call (the untuned model when no depth beat it).
        depth: The selected depth (None: untuned); ``rows``: one ``DepthRow`` per depth.

    Example:
        >>> import torch, tunetree as tt; model = torch.nn.Linear(8, 8).eval()
        >>> tt.auto_tune(model, [torch.randn(2, 8)], quick=True, cache=False, verbose=False,
        ...     strategy=tt.OneBackendStrategy(tt.backends.Eager())).model is model
        True
    """

    model: Any
    depth: int | None
    rows: list[DepthRow]
    untuned: Timing | None
    untuned_before: Timing | None = None
    untuned_after: Timing | None = None
    plan: Plan = field(default_factory=Plan)
    graphs: dict[int, list[GraphResult]] = field(default_factory=dict, repr=False)
    info: ModelInfo | None = field(default=None, repr=False)
    tuning_s: float = 0.0
    dry_run: bool = False
    original: Any = field(default=None, repr=False)
    breakdown: TimeBreakdown | None = None
    """Where the tuning time went, by phase (None for a dry run); see :meth:`timing`."""
    time_budget: float | None = None
    """The budget the tune ran under, in seconds (None: unlimited)."""
    accuracy: AccuracyBudget | None = None
    """The accuracy budget the tune ran under (None: results kept, the default)."""
    plans: dict[int, Plan] = field(default_factory=dict, repr=False)
    """The plan kept at each depth measured end to end (checked against eager there), selected
    or not; :meth:`use` installs one."""
    decision: str = ""
    """How the depth was chosen when it was not by measuring every depth here: a decision
    recorded in the tuning cache by a host of the same kind ("" after a full search)."""
    stateful: list[StatefulTrial] = field(default_factory=list)
    """``generate`` on the CPU: the whole-model stateful runner's configs, tried first."""
    multistep: list[MultiStepTrial] = field(default_factory=list)
    """``generate`` on a GPU: the multi-step decode loop's configs, tried first."""
    final: str = ""
    """The final side by side of the selected plan and the best whole-model backend of depth 0
    ("" when there was none to run: see :mod:`tunetree.search.rival`)."""

    def pareto(self, path: str | Path | None = None) -> Pareto:
        """Every plan checked under the accuracy budget: error, latency, the chosen one marked.

        ``print()`` it for the table; with ``path`` a PNG of latency against error is written
        there too (needs ``tunetree[plot]``). Refused without an accuracy budget.
        """
        if self.accuracy is None:
            raise InvalidInputError(
                "result.pareto() needs a tune under an accuracy budget: "
                "tt.auto_tune(model, data, accuracy=tt.AccuracyBudget(max_error=1e-2))"
            )
        steps = [s for r in self.rows if r.same_as is None for s in r.steps]
        row = self.selected_row
        report = Pareto(
            steps,
            self.accuracy,
            self.untuned.median_s if self.untuned else None,
            row.chosen_step if row is not None else None,
        )
        if path is not None:
            report.plot(path)
        return report

    def timing(self) -> str:
        """The tuning time by phase as a table (see :class:`tunetree.TimeBreakdown`)."""
        return str(self.breakdown) if self.breakdown is not None else "nothing was timed"

    def skipped(self) -> list[SkippedWork]:
        """Everything the time budget skipped: depths, candidates' builds and measurements."""
        found = []
        for row in self.rows:
            if row.status is DepthStatus.SKIPPED and row.error == TIME_BUDGET_ERROR:
                found.append(SkippedWork(row.depth, "depth"))
            for g in self.graphs.get(row.depth, []) if row.same_as is None else []:
                found.extend(
                    SkippedWork(
                        row.depth,
                        "build" if r.build_s is None else "measurement",
                        g.path or "<model>",
                        str(g.graph.key),
                        r.backend.name,
                        r.reason,
                    )
                    for r in g.rows
                    if r.reason == TIME_BUDGET_ERROR
                )
        return found

    @property
    def speedup(self) -> float:
        """The selected depth's side-by-side speed-up over the untuned model.

        1.0 when untuned.
        """
        chosen = [t.speedup for t in self.stateful if t.chosen] + [
            t.speedup for t in self.multistep if t.chosen
        ]
        if chosen and chosen[0]:
            return chosen[0]
        row = self.selected_row
        return row.speedup if row is not None and row.speedup else 1.0

    @property
    def selected_row(self) -> DepthRow | None:
        """The row of the selected depth, or None when the model stays untuned."""
        return next((r for r in self.rows if r.depth == self.depth), None)

    def undo(self) -> Any:
        """Remove the selected depth's wraps; returns the untuned model."""
        unwrap(self.original)
        return self.original

    def use(self, depth: int) -> Any:
        """Serve the plan measured at ``depth`` instead of the selected one; returns the model.

        For a depth the selection passed over (slower end to end on this machine, or within the
        tie tolerance of a shallower one): its plan was checked end to end like every measured
        plan, against eager (or, under an accuracy budget, against the budget). ``result.model``,
        ``depth`` and ``plan`` follow; :func:`auto_tune` installs the selected depth the same
        way. InvalidInputError for a depth that has no measured plan.
        """
        plan = measured_plan_at(self.plans, depth)
        self.model = serve_plan(self.original, plan, depth)
        self.depth, self.plan = depth, plan
        return self.model

    def shapes(self) -> str:
        """Per recorded shape, the latency of each ranged graph's winner and of eager.

        Taken at the selected depth.
        """
        graphs = self.graphs.get(self.depth, []) if self.depth is not None else []
        return "\n\n".join(t for g in graphs if (t := g.per_shape_table()))

    def __str__(self) -> str:
        with_error = self.accuracy is not None
        rows = [_depth_cells(r, r.depth == self.depth, with_error) for r in self.rows]
        error_header = [] if self.accuracy is None else ["error"]
        if self.dry_run:
            head = "Dry run: what each depth would wrap (nothing was tuned)"
        else:
            untuned = str(self.untuned) if self.untuned else "-"
            chosen = (
                f"selected depth {self.depth} ({self.speedup:.2f}x)"
                if self.depth is not None
                else "no depth beats the untuned model: left untuned"
            )
            if any(t.chosen for t in self.stateful):
                chosen = f"the whole model served by a stateful runner ({self.speedup:.2f}x)"
            if any(t.chosen for t in self.multistep):
                chosen = f"generate served by the multi-step decode loop ({self.speedup:.2f}x)"
            head = (
                f"auto_tune: untuned {untuned} (before {_t(self.untuned_before)}, after "
                f"{_t(self.untuned_after)}); {chosen}; tuning took {self.tuning_s:.1f} s"
            )
            if self.final:
                head += f"\n{self.final}"
            if self.accuracy is not None:
                head += (
                    f"\nUnder the accuracy budget {self.accuracy.describe()}: RESULTS CHANGE "
                    "(opt-in); every error is measured, see result.pareto()"
                )
        notes = [] if self.info is None else [self.info.coverage_note(), self.info.fast_path_note()]
        notes.append(self.decision)
        note = "\nNote: ".join(n for n in notes if n)
        steps = steps_table(
            self.generation_steps(),
            f"generation steps at depth {self.depth} (one call each; the generate loop's own "
            "work is in the depth's latency)",
        )
        return (
            head
            + "\n"
            + format_table(
                ["depth", "modules", "graphs", "latency", "speedup", *error_header, "status"], rows
            )
            + self._accuracy_steps()
            + (f"\n\n{whole}" if (whole := trials_table(self.stateful)) else "")
            + (f"\n\n{loop}" if (loop := multistep_table(self.multistep)) else "")
            + (f"\n\n{steps}" if steps else "")
            + (f"\nNote: {note}" if note else "")
            + self._budget_note()
            + (f"\n{self.breakdown}" if self.breakdown is not None else "")
        )

    def generation_steps(self) -> list[GenerationStep]:
        """The prefill and decode graphs tuned at the selected depth, winners beside eager.

        Empty when the workload is not autoregressive generation.
        """
        if self.depth is None:
            return []

        def names(path: str) -> list[str]:
            module = self.original if path == "" else find_module(self.original, path)
            return Binder.of_module(module).names

        return generation_steps(self.graphs.get(self.depth, []), names)

    def _accuracy_steps(self) -> str:
        """The plans checked at the selected depth under an accuracy budget ("" without)."""
        row = self.selected_row
        if self.accuracy is None or row is None or not row.steps:
            return ""
        title = f"\n\nPlans checked at depth {row.depth}, in repair order (* = chosen):"
        return title + "\n" + accuracy_steps_table(row.steps, self.accuracy)

    def _budget_note(self) -> str:
        """What the time budget skipped, counted by kind ("" when nothing)."""
        skipped = self.skipped()
        if not skipped:
            return ""
        counts: dict[str, int] = {}
        for s in skipped:
            counts[s.what] = counts.get(s.what, 0) + 1
        budget = f" of {self.time_budget:g} s" if self.time_budget is not None else ""
        parts = ", ".join(f"{n} {what}{'s' if n > 1 else ''}" for what, n in counts.items())
        return f"\nThe time budget{budget} skipped {parts}: see result.skipped()"

    def plot(self, path: str | Path) -> Path:
        """Write a PNG bar chart of latency per depth (needs ``tunetree[plot]``)."""
        labels = ["untuned"] + [f"depth {r.depth}" for r in self.rows]
        values = [self.untuned.median_s * 1e3 if self.untuned else 0.0] + [
            (r.latency_s or 0.0) * 1e3 for r in self.rows
        ]
        colors = ["grey"] + [
            "tab:green" if r.depth == self.depth else "tab:blue" for r in self.rows
        ]
        fig = figure("result.plot", (1.2 * len(labels) + 2, 4))
        ax = fig.subplots()
        ax.bar(labels, values, color=colors)
        ax.set_ylabel("median latency (ms)")
        ax.set_title("tunetree auto_tune: latency per cut depth (lower is better)")
        out = Path(path)
        fig.tight_layout()
        fig.savefig(out, dpi=100)
        return out


def measured_plan_at(plans: dict[int, Plan], depth: int) -> Plan:
    """The plan measured at ``depth``; InvalidInputError when there is none."""
    if depth not in plans:
        measured = ", ".join(str(d) for d in sorted(plans)) or "none"
        raise InvalidInputError(
            f"depth {depth} has no measured plan to use (measured depths: {measured}); "
            "see print(result) for why"
        )
    return plans[depth]


def serve_plan(original: Any, plan: Plan, depth: int) -> Any:
    """``original`` served by ``plan`` (at depth 0 a new wrapper, deeper wrapped in place)."""
    unwrap(original)
    return wrap(original, plan.runners(), plan, in_place=depth != 0)


def _depth_cells(row: DepthRow, selected: bool, with_error: bool) -> list[Any]:
    """One depth's row of the result's table."""
    return [
        f"{'*' if selected else ''}{row.depth}",
        row.modules,
        row.graphs,
        str(row.timing) if row.timing else "-",
        f"{row.speedup:.2f}x" if row.speedup else "-",
        *([_error_text(row.output_error)] if with_error else []),
        row.status_text,
    ]


def _error_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def _t(timing: Timing | None) -> str:
    return format_seconds(timing.median_s) if timing else "-"
