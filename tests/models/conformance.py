"""The invariants of issue 20, checked for one family of the Hugging Face zoo (hf_zoo.py).

:func:`check` auto-tunes one family on its tuning calls and then calls the tuned model as a user
would: unseen calls inside the tuned ranges, a call outside them and a call with another keyword
argument. It returns a :class:`ZooRow` that lists every invariant the family broke; the tests
assert the list is empty and ``benchmarks/zoo.py`` prints the rows as a table.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from typing import Any

import torch

import tunetree as tt
from tunetree.candidates.budget import TIME_BUDGET_ERROR
from tunetree.candidates.evaluate import Status
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.compare import compare
from tunetree.signature.modules import module_paths
from tunetree.signature.state import ProcessState

from .hf_zoo import Call, Family, tuning_calls, unseen_inside, unseen_outside
from .zoo import state_digest

BUDGET_GRACE = 1.10
"""Tuning may overrun its time budget by 10% (the issue's bound) plus :data:`BUDGET_SLACK_S`."""
BUDGET_SLACK_S = 5.0


@dataclasses.dataclass
class ZooRow:
    """What happened to one family: the outcome, the measurements and the broken invariants."""

    name: str
    kind: str
    depth: int | None = None
    winners: str = ""
    speedup: float = 1.0
    max_diff: float | None = None
    """Largest difference to eager over the unseen calls inside the ranges."""
    fallbacks_inside: int = 0
    fallback_warnings: int = 0
    """Warnings the outside call logged (the original forward ran)."""
    tuning_s: float = 0.0
    untuned_reason: str = ""
    failures: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """(backend, reason) of every candidate that failed or was rejected."""
    problems: list[str] = dataclasses.field(default_factory=list)

    unbuilt: str = ""
    """Default backends the time budget left unbuilt at the selected depth (else depth 0), as
    ``openvino 1/4`` (built for 1 of 4 graphs); empty when every one was built for every graph
    (a twin's narrowed race counts as built)."""

    checked_depth: int | None = None
    """The depth whose plan the unseen calls ran: the selected one, or where the selection
    left the model untuned on speed alone, the fastest depth measured (``result.use``), so
    that what is checked does not hang on how fast this machine ran."""

    @property
    def tuned(self) -> bool:
        return self.depth is not None


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def original_calls(model: Any) -> int:
    """Calls any tuned module of ``model`` handed to its original forward so far."""
    return sum(
        d.fallback_calls for _, m in module_paths(model) if (d := dispatcher_of(m)) is not None
    )


def assert_generates_as_eager(
    result: tt.TuneResult, model: Any, generate: Any, prompts: list[dict[str, Any]]
) -> None:
    """Every graph has a winner, and on each of ``prompts`` the tuned model generates eager's
    tokens with no call handed to the original forward."""
    assert result.graphs and all(g.winner is not None for g in result.graphs), result.table()
    tuned = result.model
    before = original_calls(tuned)
    for i, inputs in enumerate(prompts):
        assert torch.equal(generate(tuned, **inputs), generate(model, **inputs)), i
    assert original_calls(tuned) == before, result.table()


def _run(model: Any, call: Call, family: Family) -> Any:
    """One call as the family's users make it: ``model(**call)`` or ``model.generate``."""
    with torch.no_grad():
        if family.generate is not None:
            return model.generate(**call, **family.generate)
        return model(**call)


def _tuning_call(family: Family) -> Any:
    """``auto_tune``'s ``call=`` for a generate family (None: the model is called)."""
    settings = family.generate
    if settings is None:
        return None

    def generate(model: Any, **call: Any) -> Any:
        return model.generate(**call, **settings)

    return generate


def _untuned_reason(result: tt.AutoTuneResult) -> str:
    notes = [f"depth {r.depth}: {r.status_text}" for r in result.rows]
    return "; ".join(notes) or "no depth was tried"


def _failures(result: tt.AutoTuneResult) -> list[tuple[str, str]]:
    found = []
    for graphs in result.graphs.values():
        for graph in graphs:
            for row in graph.rows:
                if row.status in (Status.FAILED, Status.REJECTED):
                    found.append((row.backend.name, f"{graph.path or '<model>'}: {row.reason}"))
    return sorted(set(found))


def _unbuilt(result: tt.AutoTuneResult) -> str:
    """Backends the budget skipped at the selected depth (else depth 0): ``name built/graphs``."""
    depth = result.depth if result.depth is not None else 0
    graphs = result.graphs.get(depth, [])
    skipped: Counter[str] = Counter()
    for graph in graphs:
        for r in graph.rows:
            if r.reason == TIME_BUDGET_ERROR:
                skipped[r.backend.name] += 1
    notes = [f"{name} {len(graphs) - n}/{len(graphs)}" for name, n in sorted(skipped.items())]
    return ", ".join(notes)


def _winners(result: tt.AutoTuneResult) -> str:
    graphs = result.graphs.get(result.depth, []) if result.depth is not None else []
    counts = Counter(g.winner.backend.name for g in graphs if g.winner is not None)
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counts.most_common())


def _other_keyword(call: Call) -> Call:
    """The call with one more keyword argument users pass."""
    return {**call, "output_hidden_states": not call.get("output_hidden_states", False)}


def check(
    family: Family,
    *,
    time_budget: float = 150.0,
    strategy: tt.Strategy | None = None,
    measure_config: tt.MeasureConfig | None = None,
) -> ZooRow:
    """Auto-tune ``family`` (depths 0-1) and check every invariant of issue 20 on it."""
    row = ZooRow(family.name, family.kind)
    model = family.build()
    inside, outside = unseen_inside(family), unseen_outside(family)
    other = _other_keyword(inside[0])
    expected = [_run(model, c, family) for c in inside + outside]
    expected_other = None  # generate families: the tokens are the check
    if family.generate is None:
        try:
            expected_other = _run(model, other, family)
        except Exception:  # eager refuses the keyword: nothing to check
            expected_other = None
    digest, process = state_digest(model), ProcessState.now()

    start = time.perf_counter()
    result = tt.auto_tune(
        model,
        tuning_calls(family),
        call=_tuning_call(family),
        max_depth=1,
        strategy=strategy,
        measure_config=measure_config,
        time_budget=time_budget,
        cache=False,
        verbose=False,
        # the zoo checks a depth's plan (save, load, unseen shapes): generate's whole-model
        # stateful runner has its own tests (tests/generation/test_stateful*.py)
        savable=True,
    )
    row.tuning_s = time.perf_counter() - start
    row.depth, row.speedup = result.depth, result.speedup
    row.winners, row.failures = _winners(result), _failures(result)
    row.unbuilt = _unbuilt(result)
    if result.depth is None:
        row.untuned_reason = _untuned_reason(result)
    if row.tuning_s > time_budget * BUDGET_GRACE + BUDGET_SLACK_S:
        row.problems.append(f"tuning took {row.tuning_s:.0f} s, budget {time_budget:.0f} s")
    if changed := process.changes(ProcessState.now()):
        row.problems.append(f"tuning changed process settings: {', '.join(changed)}")
    if state_digest(model) != digest:
        row.problems.append("tuning changed the model's parameters, buffers or flags")

    row.checked_depth = result.depth
    if result.depth is None and result.plans:
        fastest = max(
            (r for r in result.rows if r.depth in result.plans),
            key=lambda r: r.speedup or 0.0,
        )
        row.checked_depth = fastest.depth
    # Every depth that has a plan is checked, not only the selected one: any of them could
    # have been selected on another machine or under another load (issue 33).
    try:
        for depth in sorted(result.plans):
            calls = _Calls(inside, outside, other, expected, expected_other, family)
            _check_plan(row, result.use(depth), depth, calls)
    finally:
        result.undo()
    return row


@dataclasses.dataclass
class _Calls:
    """The unseen calls one plan is checked on, with eager's outputs of each."""

    inside: list[Call]
    outside: list[Call]
    other: Call
    expected: list[Any]
    expected_other: Any
    family: Family


def _check_plan(row: ZooRow, tuned: Any, depth: int, calls: _Calls) -> None:
    """The unseen calls on the plan of ``depth``: eager's results, and fallbacks only outside."""
    problems = len(row.problems)
    before = original_calls(tuned)
    inside, expected = calls.inside, calls.expected
    warnings = _Warnings()
    logging.getLogger("tunetree.runtime.wrap").addHandler(warnings)
    try:
        _check_calls(
            row,
            tuned,
            inside,
            expected[: len(inside)],
            "unseen call inside the ranges",
            calls.family,
        )
        fell_back = original_calls(tuned) - before
        row.fallbacks_inside += fell_back
        if fell_back:
            row.problems.append(f"{fell_back} calls inside the ranges fell back")
        warnings.messages.clear()
        inside_total = original_calls(tuned)
        _check_calls(
            row,
            tuned,
            calls.outside,
            expected[len(inside) :],
            "call outside the ranges",
            calls.family,
        )
        row.fallback_warnings += len(warnings.messages)
        if original_calls(tuned) == inside_total:
            row.problems.append("the call outside the ranges did not run the original forward")
        elif not warnings.messages:
            row.problems.append("the call outside the ranges fell back without a warning")
        if calls.expected_other is not None:
            _check_calls(
                row,
                tuned,
                [calls.other],
                [calls.expected_other],
                "call with another keyword",
                calls.family,
            )
    finally:
        logging.getLogger("tunetree.runtime.wrap").removeHandler(warnings)
    row.problems[problems:] = [f"depth {depth}: {p}" for p in row.problems[problems:]]


def _check_calls(
    row: ZooRow, tuned: Any, calls: list[Call], expected: list[Any], what: str, family: Family
) -> None:
    for call, want in zip(calls, expected, strict=True):
        try:
            got = _run(tuned, call, family)
        except Exception as exc:
            row.problems.append(f"{what} raised {type(exc).__name__}: {exc}"[:300])
            continue
        comparison = compare(want, got)
        if not comparison.ok:
            row.problems.append(f"{what} differs from eager: {comparison.reason}"[:300])
        elif what.startswith("unseen"):
            row.max_diff = max(row.max_diff or 0.0, comparison.max_abs_diff)
