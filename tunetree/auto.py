"""auto_tune(): tune every cut depth, measure each end to end, keep the fastest.

The untuned model is measured before the first depth and again after the last one;
the lower of the two is the baseline (a device may not reach full clock during the
first measurements). Among depths within ``tie_tolerance`` of the fastest the
shallowest wins; when no depth beats the untuned model, the model stays untuned.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ._table import format_seconds, format_table
from .cache import open_cache
from .compare import Tolerances, compare_all
from .errors import InvalidInputError, MissingDependencyError
from .graph import Sample
from .inspection import CallFn, ModelInfo, inspect, module_paths, run_model
from .measure import MeasureConfig, Timing, cycle_calls, measure
from .plan import Plan
from .progress import Progress
from .strategy import Strategy, default_strategy
from .tune import GraphCache, GraphMemo, GraphResult, check_device, check_untuned, plan_from
from .tune import tune_cut as _tune_cut
from .wrap import unwrap, wrap

TIME_BUDGET_ERROR = "time budget used up"
MAX_DEFAULT_DEPTH = 3
"""Default deepest depth tried: deeper cuts wrap many tiny modules and rarely win."""


@dataclass
class DepthRow:
    """One depth of an auto-tune."""

    depth: int
    modules: int
    graphs: int
    status: str = "not started"
    timing: Timing | None = None
    speedup: float | None = None
    error: str = ""
    same_as: int | None = None

    @property
    def latency_s(self) -> float | None:
        return self.timing.median_s if self.timing else None


@dataclass
class AutoTuneResult:
    """What :func:`auto_tune` did. ``result.model`` is always the thing to call.

    When depth 0 wins, ``model`` is a new wrapper sharing the original's parameters and
    the object given in stays untuned; when a deeper depth wins its modules are wrapped
    in place; when nothing beats the untuned model, ``model`` is the untuned object.
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

    @property
    def speedup(self) -> float:
        """Untuned latency over the selected depth's latency (1.0 when untuned)."""
        row = self.selected_row
        if row is None or not self.untuned or not row.latency_s:
            return 1.0
        return self.untuned.median_s / row.latency_s

    @property
    def selected_row(self) -> DepthRow | None:
        return next((r for r in self.rows if r.depth == self.depth), None)

    def undo(self) -> Any:
        """Remove the selected depth's wraps; returns the untuned model."""
        unwrap(self.original)
        return self.original

    def __str__(self) -> str:
        rows = []
        for r in self.rows:
            mark = "*" if r.depth == self.depth else ""
            status = r.status + (f": {r.error}" if r.error else "")
            rows.append(
                [
                    f"{mark}{r.depth}",
                    r.modules,
                    r.graphs,
                    str(r.timing) if r.timing else "-",
                    f"{r.speedup:.2f}x" if r.speedup else "-",
                    status,
                ]
            )
        if self.dry_run:
            head = "Dry run: what each depth would wrap (nothing was tuned)"
        else:
            untuned = str(self.untuned) if self.untuned else "-"
            chosen = (
                f"selected depth {self.depth} ({self.speedup:.2f}x)"
                if self.depth is not None
                else "no depth beats the untuned model: left untuned"
            )
            head = (
                f"auto_tune: untuned {untuned} (before {_t(self.untuned_before)}, after "
                f"{_t(self.untuned_after)}); {chosen}; tuning took {self.tuning_s:.1f} s"
            )
        return (
            head
            + "\n"
            + format_table(["depth", "modules", "graphs", "latency", "speedup", "status"], rows)
        )

    def plot(self, path: str | Path) -> Path:
        """Write a PNG bar chart of latency per depth (needs ``tunetree[plot]``)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise MissingDependencyError(
                "result.plot needs matplotlib: pip install 'tunetree[plot]'"
            ) from exc
        labels = ["untuned"] + [f"depth {r.depth}" for r in self.rows]
        values = [self.untuned.median_s * 1e3 if self.untuned else 0.0] + [
            (r.latency_s or 0.0) * 1e3 for r in self.rows
        ]
        colors = ["grey"] + [
            "tab:green" if r.depth == self.depth else "tab:blue" for r in self.rows
        ]
        fig, ax = plt.subplots(figsize=(1.2 * len(labels) + 2, 4))
        ax.bar(labels, values, color=colors)
        ax.set_ylabel("median latency (ms)")
        ax.set_title("tunetree auto_tune: latency per cut depth (lower is better)")
        out = Path(path)
        fig.tight_layout()
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return out


def _t(timing: Timing | None) -> str:
    return format_seconds(timing.median_s) if timing else "-"


Placement = dict[tuple[int, str], tuple[torch.nn.Module, torch.device, torch.dtype]]


def _tensor_devices(model: Any) -> Placement:
    """Device and dtype of every parameter and buffer, to put back what a backend moved."""
    found: Placement = {}
    for _, module in module_paths(model):
        for name, tensor in list(module.named_parameters(recurse=False)) + list(
            module.named_buffers(recurse=False)
        ):
            if tensor is not None:
                found[(id(module), name)] = (module, tensor.device, tensor.dtype)
    return found


def _restore_devices(saved: Placement) -> None:
    for (_, name), (module, device, dtype) in saved.items():
        tensor = getattr(module, name, None)
        if isinstance(tensor, torch.Tensor) and (tensor.device, tensor.dtype) != (device, dtype):
            tensor.data = tensor.data.to(device=device, dtype=dtype)


def _measure_model(
    model: Any, info: ModelInfo, call: CallFn | None, config: MeasureConfig
) -> Timing:
    fn = cycle_calls(lambda *a, **k: run_model(model, Sample(a, k), call), info.samples)
    return measure({"model": fn}, info.device, config)["model"]


def auto_tune(
    model: Any,
    dataset: Iterable[Any],
    *,
    min_depth: int = 0,
    max_depth: int | None = None,
    strategy: Strategy | None = None,
    device: torch.device | str | None = None,
    tie_tolerance: float = 0.02,
    time_budget: float | None = None,
    dry_run: bool = False,
    call: CallFn | None = None,
    tolerances: Tolerances | None = None,
    measure_config: MeasureConfig | None = None,
    verbose: bool = True,
    cache: GraphCache | str | os.PathLike[str] | bool | None = None,
) -> AutoTuneResult:
    """Tune every distinct cut from ``min_depth`` to ``max_depth``, measure each end to end
    on ``dataset``, and keep the fastest (the shallowest within ``tie_tolerance``), or the
    untuned model when no depth beats it.

    ``strategy=None`` uses :func:`tunetree.default_strategy` for the device; every graph
    gets its own copy. A graph tuned at one depth is reused at every other depth that
    wraps the same module with the same graph. ``time_budget`` (seconds, counted from the
    call) stops new depths from starting; the depth in progress finishes. ``dry_run``
    reports what each depth would wrap and tunes nothing. Progress goes to stderr unless
    ``verbose=False``. ``cache`` is the tuning cache consulted per graph, as in
    :func:`tunetree.tune` (None: the default directory; False: none).
    """
    if min_depth < 0 or (max_depth is not None and max_depth < min_depth):
        raise InvalidInputError(f"need 0 <= min_depth <= max_depth, got {min_depth}, {max_depth}")
    if tie_tolerance < 0:
        raise InvalidInputError("tie_tolerance must be >= 0")
    start = time.perf_counter()
    check_untuned(model)
    dev = check_device(model, device)
    progress = Progress(verbose)
    config = measure_config or MeasureConfig()
    progress("inspecting the model")
    info = inspect(model, dataset, call=call, device=dev)
    last = min(info.max_depth, MAX_DEFAULT_DEPTH) if max_depth is None else max_depth
    last = min(last, info.max_depth)
    rows = [
        DepthRow(d, s.modules, s.graphs)
        for d in range(min_depth, last + 1)
        for s in [info.summary(d)]
    ]
    if dry_run:
        for row in rows:
            row.status = "dry run"
        return AutoTuneResult(model, None, rows, None, info=info, dry_run=True, original=model)

    graph_cache = open_cache(cache)
    strategy = strategy or default_strategy(dev)  # built once: its log lines appear once
    devices = _tensor_devices(model)
    progress("measuring the untuned model")
    before = _measure_model(model, info, call, config)
    memo: GraphMemo = {}
    plans: dict[int, Plan] = {}
    graphs: dict[int, list[GraphResult]] = {}
    cuts: dict[tuple[str, ...], int] = {}
    try:
        for row in rows:
            if time_budget is not None and time.perf_counter() - start > time_budget:
                row.status, row.error = "skipped", TIME_BUDGET_ERROR
                continue
            cut = tuple(info.cut(row.depth))
            if cut in cuts:
                twin = next(r for r in rows if r.depth == cuts[cut])
                row.status, row.same_as = f"same cut as depth {twin.depth}", twin.depth
                row.timing, row.error = twin.timing, twin.error
                continue
            cuts[cut] = row.depth
            progress(f"depth {row.depth}", f"{row.modules} modules, {row.graphs} graphs")
            results = _tune_cut(
                model,
                info,
                row.depth,
                strategy=strategy,
                tolerances=tolerances or Tolerances(),
                measure_config=config,
                progress=progress,
                memo=memo,
                cache=graph_cache,
            )
            _restore_devices(devices)
            graphs[row.depth] = results
            plan = plan_from(results, row.depth)
            if not plan.entries:
                reasons = [r.reason for g in results for r in g.rows if r.reason]
                row.status = "skipped"
                row.error = "every module failed to tune" + (f" ({reasons[0]})" if reasons else "")
                continue
            runners = plan.runners()
            if not runners:
                row.status = "no change: every graph kept eager"
                continue
            plans[row.depth] = plan
            tuned = wrap(model, runners)
            try:
                with torch.no_grad():
                    outputs = [run_model(tuned, s, call) for s in info.samples]
                check = compare_all(info.outputs, outputs, _end_to_end_tolerances(plan, tolerances))
                if not check.ok:
                    row.status, row.error = "rejected", f"end-to-end output: {check.reason}"
                    continue
                progress(f"depth {row.depth}", "measuring end to end")
                row.timing = _measure_model(tuned, info, call, config)
                row.status = "measured"
            except Exception as exc:
                row.status, row.error = "failed", f"{type(exc).__name__}: {exc}"
            finally:
                unwrap(model)
                _restore_devices(devices)
    except BaseException:
        unwrap(model)
        _restore_devices(devices)
        raise

    after = None
    if any(r.timing is not None and r.same_as is None for r in rows):
        progress("measuring the untuned model again")
        after = _measure_model(model, info, call, config)
    untuned = min((t for t in (before, after) if t is not None), key=lambda t: t.median_s)
    for row in rows:
        if row.latency_s:
            row.speedup = untuned.median_s / row.latency_s

    selected = _select(rows, untuned, tie_tolerance)
    tuned_model: Any = model
    plan = Plan()
    if selected is not None:
        plan = plans[selected]
        tuned_model = wrap(model, plan.runners(), plan)
    return AutoTuneResult(
        tuned_model,
        selected,
        rows,
        untuned,
        before,
        after,
        plan,
        graphs,
        info,
        time.perf_counter() - start,
        original=model,
    )


def _end_to_end_tolerances(plan: Plan, given: Tolerances | None) -> Tolerances | None:
    """Tolerances for the whole model's output: the caller's, else the loosest of the opt-in
    backends in the plan (a user who opted into bf16 accepted its error), else the defaults."""
    if given is not None:
        return given
    loose = [t for e in plan.entries if (t := e.backend.tolerances()) is not None]
    if not loose:
        return None
    atol = max(tol.atol for t in loose for tol in t.by_dtype.values())
    rtol = max(tol.rtol for t in loose for tol in t.by_dtype.values())
    return Tolerances.uniform(atol, rtol)


def _select(rows: list[DepthRow], untuned: Timing, tie_tolerance: float) -> int | None:
    """The shallowest depth within ``tie_tolerance`` of the fastest, if it beats untuned."""
    measured = [r for r in rows if r.latency_s is not None and r.same_as is None]
    if not measured:
        return None
    fastest = min(r.latency_s for r in measured if r.latency_s is not None)
    tied = [
        r
        for r in measured
        if r.latency_s is not None and r.latency_s <= fastest * (1 + tie_tolerance)
    ]
    choice = min(tied, key=lambda r: r.depth)
    if choice.latency_s is None or choice.latency_s >= untuned.median_s:
        return None
    return choice.depth
