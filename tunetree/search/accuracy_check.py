"""The end-to-end half of an accuracy budget: judge whole plans, fit each depth's plans into it.

:class:`EndToEndCheck` holds fp32 eager's outputs of the tuning inputs and of the held-out
inputs (not used to choose) and the untuned model's task score, all computed once; its
:meth:`~EndToEndCheck.verdict` runs a tuned model on them. :meth:`~EndToEndCheck.fit` walks a
depth's plan through the repair order of :func:`tunetree.accuracy.repair.repair`, and adds the
plan that keeps every result, so a report shows what the budget bought.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..accuracy.budget import AccuracyBudget
from ..accuracy.metrics import output_error
from ..accuracy.repair import GraphId, PlanStep, Verdict, repair, results_kept
from ..candidates.results import GraphResult
from ..runtime.plan import Plan, PlanEntry
from ..runtime.wrap import wrap
from ..signature import parking
from ..signature.compare import compare_all
from ..signature.graph import Sample, as_samples, detach_clone
from ..signature.inspection import ModelInfo
from ..signature.modules import CallFn, run_model

log = logging.getLogger(__name__)

KEEPS_RESULTS = "every graph on a results-keeping backend"
MAX_ALONE_CHECKS = 16
"""Most results-changing graphs whose impact is measured on the model's outputs one by one
(each costs a run over the failing inputs); with more, their own modules' errors rank them."""


@dataclass
class EndToEndCheck:
    """A budget's end-to-end check, with every reference it needs computed once."""

    budget: AccuracyBudget
    samples: list[Sample]
    references: list[Any]
    heldout: list[Sample]
    heldout_references: list[Any]
    reference_score: float | None
    call: CallFn | None

    @classmethod
    def prepare(
        cls,
        budget: AccuracyBudget,
        model: Any,
        info: ModelInfo,
        held: Iterable[Any],
        call: CallFn | None,
    ) -> EndToEndCheck:
        """References from the untuned ``model``.

        The inspection's outputs, eager's outputs of the ``held`` dataset items and, with
        ``evaluate``, the untuned score.
        """
        held_items = list(held)
        heldout = [s.to(info.device) for s in as_samples(held_items)] if held_items else []
        with torch.no_grad():
            references = [detach_clone(run_model(model, s, call)) for s in heldout]
        score = _score(budget, model) if budget.evaluate is not None else None
        return cls(budget, info.samples, info.outputs, heldout, references, score, call)

    def verdict(self, tuned: Any) -> Verdict:
        """Whether ``tuned`` holds the budget: tuning inputs, then held-out ones, then the score.

        Outputs that cannot be compared at all (another structure, integers or NaN where eager
        has others: an infinite error) break every budget, a task-metric one too.
        """
        budget = self.budget
        try:
            outputs = self._outputs(tuned, self.samples)
            error = output_error(self.references, outputs, budget.metric)
            wrong = self._over(error, self.references, outputs)
            if wrong:
                return Verdict(False, error, reason=wrong)
            held = None
            if self.heldout:
                held_outputs = self._outputs(tuned, self.heldout)
                held = output_error(self.heldout_references, held_outputs, budget.metric)
                wrong = self._over(held, self.heldout_references, held_outputs)
                if wrong:
                    return Verdict(
                        False, error, held, reason=f"held-out {wrong}", heldout_only=True
                    )
            if budget.evaluate is None or self.reference_score is None:
                return Verdict(True, error, held)
            drop = self.reference_score - _score(budget, tuned)
        except Exception as exc:  # a plan that cannot run is outside any budget
            log.info("accuracy check of a plan failed: %s", exc)
            return Verdict(False, reason=f"fails: {type(exc).__name__}: {exc}"[:200])
        assert budget.max_drop is not None
        if not drop <= budget.max_drop:
            return Verdict(False, error, held, drop, f"score drop {drop:.3g} > {budget.max_drop:g}")
        return Verdict(True, error, held, drop)

    def _over(self, error: float, references: list[Any], outputs: list[Any]) -> str:
        """Why ``error`` breaks the budget ("" when it does not); names an incomparable output."""
        if math.isinf(error):
            reason = compare_all(references, outputs).reason or "an output cannot be compared"
            return "not comparable: " + " ".join(reason.split())[:160]
        limit = self.budget.max_error
        return f"{error:.3g} > {limit:g}" if limit is not None and error > limit else ""

    def _outputs(self, tuned: Any, samples: list[Sample]) -> list[Any]:
        with torch.no_grad():
            return [run_model(tuned, s, self.call) for s in samples]

    def _error(self, tuned: Any, samples: list[Sample], references: list[Any]) -> float:
        return output_error(references, self._outputs(tuned, samples), self.budget.metric)

    def fit(
        self, model: Any, depth: int, plans: Mapping[str, Plan], graphs: list[GraphResult]
    ) -> list[PlanStep]:
        """Every plan step of the depth, in the order checked.

        Each named plan is repaired until within the budget, then the plan that keeps every
        result is added (when it differs from the steps before).
        """
        fallback = _fallbacks(graphs)
        steps: list[PlanStep] = []
        seen: set[frozenset[tuple[str, Any, int]]] = set()  # Plan.signature()

        def check(plan: Plan) -> Verdict:
            return self.verdict(wrap(model, plan.runners(), in_place=False))

        for name, plan in plans.items():
            if plan.signature() in seen:
                continue
            first = check(plan)
            impact = {} if first.within else self.impacts(model, plan, graphs, first)
            for step in repair(depth, name, plan, impact, fallback, check, first):
                if step.plan.signature() not in seen:
                    seen.add(step.plan.signature())
                    steps.append(step)
        for plan in plans.values():
            kept = results_kept(plan, fallback)
            if kept.signature() not in seen and kept.runners():
                seen.add(kept.signature())
                steps.append(PlanStep(depth, KEEPS_RESULTS, kept, check(kept)))
        return steps

    def impacts(
        self, model: Any, plan: Plan, graphs: list[GraphResult], failed: Verdict
    ) -> dict[GraphId, float]:
        """Each results-changing graph's measured impact on a plan that broke the budget.

        Up to :data:`MAX_ALONE_CHECKS` graphs: the model's output error with that graph alone on
        its candidate, on the inputs where the plan failed (the held-out ones when only they
        showed it): errors of one module can grow or vanish downstream, so the model's output is
        what ranks them. With more graphs, each candidate's error on its own module's outputs.
        """
        own = _module_errors(plan, graphs, self.budget)
        if len(own) > MAX_ALONE_CHECKS:
            return own
        samples, references = (
            (self.heldout, self.heldout_references)
            if failed.heldout_only
            else (self.samples, self.references)
        )
        found = {}
        for entry in plan.entries:
            graph = (entry.path, entry.key)
            if graph not in own:
                continue
            alone = Plan([entry], plan.depth)
            try:
                tuned = wrap(model, alone.runners(), in_place=False)
                found[graph] = self._error(tuned, samples, references)
            except Exception as exc:  # it cannot run alone: give it back first
                log.info("impact of %s alone could not be measured: %s", entry.path, exc)
                found[graph] = math.inf
        return found


def _score(budget: AccuracyBudget, model: Any) -> float:
    assert budget.evaluate is not None
    with torch.no_grad():
        score = float(budget.evaluate(model))
    return score if not math.isnan(score) else -math.inf


def _module_errors(
    plan: Plan, graphs: list[GraphResult], budget: AccuracyBudget
) -> dict[GraphId, float]:
    """The error of each results-changing entry of ``plan`` on its own graph's outputs.

    The candidate's row records it when it was built under the budget; otherwise (a row from an
    older cache entry) it is measured now on the graph's samples.
    """
    by_graph = {(g.path, g.graph.key): g for g in graphs}
    found: dict[GraphId, float] = {}
    for entry in plan.entries:
        graph = by_graph.get((entry.path, entry.key))
        if entry.backend.preserves_results or graph is None:
            continue
        row = next((r for r in graph.rows if r.runner is entry.runner), None)
        if row is not None and row.error is not None:
            found[(entry.path, entry.key)] = row.error
            continue
        with torch.no_grad():
            outputs = [s.run(entry.runner) for s in graph.graph.samples]
        references = [parking.reference(graph.graph, i) for i in range(len(outputs))]
        found[(entry.path, entry.key)] = output_error(references, outputs, budget.module_metric)
    return found


def _fallbacks(graphs: list[GraphResult]) -> dict[GraphId, PlanEntry | None]:
    """What each graph returns to when its results-changing candidate is given back.

    Its fastest usable results-keeping candidate other than eager
    (:meth:`GraphResult.fastest_keeping`), when faster than eager (None: the module's forward).
    """
    found: dict[GraphId, PlanEntry | None] = {}
    for g in graphs:
        eager = g.eager_latency_s
        best = g.fastest_keeping()
        slower = best is not None and eager is not None and (best.latency_s or 0.0) >= eager
        if best is None or best.runner is None or slower:
            found[(g.path, g.graph.key)] = None
        else:
            found[(g.path, g.graph.key)] = PlanEntry(
                g.path, g.graph.key, best.backend, best.runner, best.latency_s, eager
            )
    return found
