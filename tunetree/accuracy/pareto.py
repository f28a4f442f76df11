"""Latency against error for every plan an accuracy-budgeted tune checked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._util.plot import figure
from .._util.table import format_seconds, format_table
from .budget import AccuracyBudget
from .metrics import metric_name
from .repair import PlanStep


def _error_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def step_rows(steps: Sequence[PlanStep], selected: PlanStep | None = None) -> list[list[object]]:
    """Table rows of plan steps: depth, plan, errors, score drop, latency, verdict.

    ``*`` marks ``selected``, or each step chosen at its depth when None.
    """
    rows: list[list[object]] = []
    for s in steps:
        v = s.verdict
        mark = s is selected if selected is not None else s.chosen
        rows.append(
            [
                f"{'*' if mark else ''}{s.depth}",
                s.label,
                _error_text(v.error),
                _error_text(v.heldout_error),
                _error_text(v.score_drop),
                format_seconds(s.latency_s),
                f"{s.speedup:.2f}x" if s.speedup else "-",
                "yes" if v.within else f"no: {v.reason}",
            ]
        )
    return rows


def step_headers(budget: AccuracyBudget) -> list[str]:
    """The columns of :func:`step_rows`, the error columns named by the budget's metric."""
    name = metric_name(budget.metric)
    return ["depth", "plan", name, f"held-out {name}", "score drop", "latency", "speedup", "within"]


def steps_table(steps: Sequence[PlanStep], budget: AccuracyBudget, title: str = "") -> str:
    """Every plan step as a table under ``title`` (* marks the chosen plan)."""
    return format_table(step_headers(budget), step_rows(steps), title=title)


def on_front(steps: Sequence[PlanStep]) -> list[PlanStep]:
    """The measured steps no other measured step beats on both latency and error."""
    timed = [s for s in steps if s.latency_s is not None and s.verdict.error is not None]

    def beaten(s: PlanStep) -> bool:
        assert s.latency_s is not None and s.verdict.error is not None
        return any(
            o is not s
            and o.latency_s <= s.latency_s  # type: ignore[operator]
            and o.verdict.error <= s.verdict.error  # type: ignore[operator]
            and (o.latency_s, o.verdict.error) != (s.latency_s, s.verdict.error)
            for o in timed
        )

    return [s for s in timed if not beaten(s)]


@dataclass
class Pareto:
    """Every plan checked under a budget: its error and, when measured, its latency.

    ``print()`` shows the table (``front`` marks the plans no other plan beats on both);
    :meth:`plot` draws latency against error as a PNG.
    """

    steps: list[PlanStep]
    budget: AccuracyBudget
    untuned_s: float | None = None
    selected: PlanStep | None = None
    """The plan the tune chose (None: left untuned)."""
    png: Path | None = field(default=None)

    @property
    def front(self) -> list[PlanStep]:
        """The measured plans that no other measured plan beats on both latency and error."""
        return on_front(self.steps)

    def __str__(self) -> str:
        front = {id(s) for s in self.front}
        rows = step_rows(self.steps, self.selected)
        for row, step in zip(rows, self.steps, strict=True):
            row.append("yes" if id(step) in front else "")
        untuned = f"; untuned {format_seconds(self.untuned_s)}" if self.untuned_s else ""
        return format_table(
            [*step_headers(self.budget), "front"],
            rows,
            title=f"Plans checked under the budget {self.budget.describe()} (* = chosen){untuned}",
        ) + (f"\nplot: {self.png}" if self.png is not None else "")

    def plot(self, path: str | Path) -> Path:
        """Write latency (ms) against error as a PNG (needs ``tunetree[plot]``); returns it."""
        fig = figure("result.pareto(path)", (6.5, 4.5))
        ax = fig.subplots()
        for step in self.steps:
            if step.latency_s is None or step.verdict.error is None:
                continue
            chosen = step is self.selected
            color = "tab:green" if chosen else ("tab:blue" if step.verdict.within else "grey")
            ax.scatter(
                max(step.verdict.error, 1e-12),
                step.latency_s * 1e3,
                color=color,
                s=80 if chosen else 30,
                zorder=3,
            )
        if self.budget.max_error is not None:
            ax.axvline(self.budget.max_error, color="tab:red", linestyle="--", label="budget")
        if self.untuned_s:
            ax.axhline(self.untuned_s * 1e3, color="black", linestyle=":", label="untuned")
        ax.set_xscale("log")
        ax.set_xlabel(f"{metric_name(self.budget.metric)} vs fp32 eager (log)")
        ax.set_ylabel("median latency (ms)")
        ax.set_title("tunetree: latency against error (green: chosen, grey: over budget)")
        ax.legend(loc="best")
        out = Path(path)
        fig.tight_layout()
        fig.savefig(out, dpi=100)
        self.png = out
        return out
