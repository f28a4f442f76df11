from __future__ import annotations

import pytest
import torch

import tunetree as tt
from tests.accuracy.lossy import Chain, Lossy
from tests.fakes import Delayed
from tunetree.backends import Eager
from tunetree.candidates.evaluate import Status

pytestmark = pytest.mark.usefixtures("virtual_time")
"""Every test here decides on timings its fakes declare (``tests/clock.py``, issue 33)."""

QUICK = tt.MeasureConfig(warmup_s=0.01, block_s=0.01, trials=5, max_s_per_candidate=0.3)


def data(n: int = 4, scale: float = 1.0) -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randn(4, 16) * scale for _ in range(n)]


def budgeted(model, dataset, budget, backend=None, **kw):
    strategy = tt.HighestThroughputStrategy([backend or Lossy(), Eager()])
    kw.setdefault("measure_config", QUICK)
    kw.setdefault("cache", False)
    return tt.auto_tune(
        model,
        dataset,
        min_depth=1,
        max_depth=1,
        strategy=strategy,
        accuracy=budget,
        verbose=False,
        time_budget=None,
        **kw,
    )


def lossy_paths(result) -> dict[str, str]:
    return {e.path: e.backend.kind for e in result.plan.entries if e.backend.kind != "eager"}


def test_a_plan_over_budget_gives_back_the_largest_error_first() -> None:
    model = Chain([0.001, 0.004, 0.002])
    result = budgeted(model, data(), tt.AccuracyBudget(max_error=0.005))
    row = result.selected_row
    assert result.depth == 1 and row is not None
    errors = [round(s.verdict.error, 4) for s in row.steps[:2]]
    assert errors == [0.0070, 0.0030]  # (1.001)(1.004)(1.002) - 1, then without stage 1
    assert not row.steps[0].verdict.within and row.steps[1].verdict.within
    assert "stages.1 back to its forward" in row.steps[1].label
    assert lossy_paths(result) == {"stages.0": "fake-lossy", "stages.2": "fake-lossy"}
    assert row.output_error == pytest.approx(0.003, abs=2e-4)
    assert result.plan.accuracy is not None and result.plan.accuracy["changes_results"]
    # The tuned model's outputs hold the budget on inputs it was not tuned on.
    x = torch.randn(4, 16)
    with torch.no_grad():
        ref, got = model(x), result.model(x)
    assert float((got - ref).norm() / ref.norm()) <= 0.005
    text = str(result)
    assert "RESULTS CHANGE" in text and "repair order" in text and "back to its forward" in text


def test_candidates_over_the_module_limit_are_rejected_on_their_own() -> None:
    model = Chain([0.02, 0.001])
    result = budgeted(model, data(), tt.AccuracyBudget(max_error=0.01))
    rows = {g.path: g for g in result.graphs[1]}
    lossy = next(r for r in rows["stages.0"].rows if r.backend.kind == "fake-lossy")
    assert lossy.status is Status.REJECTED
    assert "module limit" in lossy.reason
    assert lossy.error == pytest.approx(0.02, rel=1e-3)
    assert lossy_paths(result) == {"stages.1": "fake-lossy"}


def test_without_a_budget_the_default_strategy_never_changes_results() -> None:
    strategy = tt.default_strategy("cpu")
    assert all(b.preserves_results for b in strategy.backends)
    assert not all(b.preserves_results for b in tt.accuracy_strategy("cpu").backends) or not (
        tt.backends.reduced_precision_backends(torch.device("cpu"))
    )


def test_an_error_only_held_out_inputs_show_is_caught_and_repaired() -> None:
    # The stages are exact on inputs below 50 in magnitude: the tuning inputs; the held-out
    # input (the dataset's last quarter) is 100 times larger and shows the error.
    model = Chain([0.003, 0.004])
    dataset = [*data(3), torch.randn(4, 16) * 100]
    result = budgeted(model, dataset, tt.AccuracyBudget(max_error=0.005), Lossy(above=50.0))
    row = result.selected_row
    assert row is not None
    first = row.steps[0].verdict
    assert first.error == pytest.approx(0.0, abs=1e-6) and not first.within
    assert "held-out" in first.reason
    # Both stages measured 0 on their own modules' tuning inputs: their impact is measured on
    # the held-out input, where stage 1 (0.004) costs more than stage 0 (0.003).
    assert "stages.1 back to its forward (impact 0.004)" in row.steps[1].label
    chosen = row.chosen_step
    assert chosen is not None and chosen.verdict.within
    assert chosen.verdict.heldout_error == pytest.approx(0.003, rel=0.05)
    assert lossy_paths(result) == {"stages.0": "fake-lossy"}


def test_a_task_metric_budget_calls_evaluate_on_the_tuned_model() -> None:
    model = Chain([0.001, 0.004, 0.002])
    x_val = torch.randn(4, 16)  # a shape the tune saw: other shapes run eager
    with torch.no_grad():
        reference = model(x_val)
    calls = []

    def score(m) -> float:  # higher is better: minus the relative error on a validation batch
        calls.append(m)
        return -float((m(x_val) - reference).norm() / reference.norm())

    budget = tt.AccuracyBudget(max_drop=0.005, evaluate=score)
    result = budgeted(model, data(), budget)
    chosen = result.selected_row.chosen_step
    assert chosen is not None and chosen.verdict.score_drop == pytest.approx(0.003, abs=3e-4)
    assert calls[0] is model  # the untuned score first
    assert lossy_paths(result) == {"stages.0": "fake-lossy", "stages.2": "fake-lossy"}


def test_pareto_lists_every_plan_and_marks_the_chosen_one(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    model = Chain([0.001, 0.004, 0.002])
    result = budgeted(model, data(), tt.AccuracyBudget(max_error=0.005))
    report = result.pareto(tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    assert report.selected is result.selected_row.chosen_step
    assert len(report.steps) >= 2
    text = str(report)
    assert "front" in text and "*1" in text
    assert report.selected in report.front
    with pytest.raises(tt.InvalidInputError, match="accuracy budget"):
        tt.auto_tune(
            Chain([0.0]),
            data(),
            strategy=tt.OneBackendStrategy(Delayed()),
            verbose=False,
            measure_config=QUICK,
        ).pareto()


def test_a_checkpoint_records_the_budget_and_says_so_on_load(tmp_path, caplog) -> None:
    model = Chain([0.001, 0.004, 0.002])
    result = budgeted(model, data(), tt.AccuracyBudget(max_error=0.005))
    path = tt.save(result, tmp_path / "m.tt")
    info = tt.checkpoint.info.read_info(path)
    assert info.manifest.accuracy["budget"]["max_error"] == 0.005
    assert info.to_json()["accuracy"]["error"] == pytest.approx(0.003, abs=2e-4)
    fresh = Chain([0.001, 0.004, 0.002])
    with caplog.at_level("WARNING", logger="tunetree"):
        loaded = tt.load(fresh, path)
    assert "accuracy budget" in caplog.text and "differ from eager" in caplog.text
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.allclose(loaded(x), result.model(x))


def test_budget_admitted_candidates_are_cached_apart_from_default_ones(tmp_path) -> None:
    model = Chain([0.001, 0.004, 0.002])
    budget = tt.AccuracyBudget(max_error=0.005)
    first = budgeted(model, data(), budget, cache=tmp_path)
    first.undo()
    again = budgeted(model, data(), budget, cache=tmp_path)
    again.undo()
    assert all("(cached)" in g.strategy for g in again.graphs[1])
    assert lossy_paths(again) == lossy_paths(first)
    # The same strategy without a budget checks the lossy stages by their tolerances (exact
    # here), so it must not reuse the entries admitted under the budget.
    plain = tt.auto_tune(
        model,
        data(),
        min_depth=1,
        max_depth=1,
        strategy=tt.HighestThroughputStrategy([Lossy(), Eager()]),
        measure_config=QUICK,
        verbose=False,
        cache=tmp_path,
    )
    assert not any("(cached)" in g.strategy for g in plain.graphs[1])
    assert lossy_paths(plain) == {}


def test_the_cache_key_holds_the_budget_module_limit() -> None:
    from tunetree.cache import keys
    from tunetree.candidates.evaluate import GraphSession

    model = Chain([0.001])
    info = tt.inspect(model, data())
    graph = next(iter(info.modules["stages.0"].graphs.values()))
    strategy = tt.HighestThroughputStrategy([Lossy(), Eager()])

    def key(accuracy) -> str:
        session = GraphSession(
            model.stages[0], "stages.0", graph, torch.device("cpu"), accuracy=accuracy
        )
        return keys.entry_identity(session, strategy).key

    plain, loose = key(None), key(tt.AccuracyBudget(max_error=0.01))
    assert plain != loose
    assert loose != key(tt.AccuracyBudget(max_error=0.02))
    assert loose == key(tt.AccuracyBudget(max_error=0.01, holdout=0.5))  # end to end only


def test_twin_layers_give_precision_back_to_a_results_keeping_candidate() -> None:
    from tests.accuracy.lossy import Exact

    model = Chain([0.004, 0.004, 0.004])  # three twins: the same structure and graph
    exact = Exact()
    strategy = tt.HighestThroughputStrategy([Lossy(), exact, Eager()])
    result = tt.auto_tune(
        model,
        data(),
        min_depth=1,
        max_depth=1,
        strategy=strategy,
        accuracy=tt.AccuracyBudget(max_error=0.005),
        measure_config=QUICK,
        verbose=False,
        cache=False,
        time_budget=None,
    )
    assert len(exact.builds) == 3  # the twins race the first stage's fallback too
    assert "twin of stages.0" in result.graphs[1][1].strategy
    kinds = sorted(e.backend.kind for e in result.plan.entries)
    assert kinds == ["fake-exact", "fake-exact", "fake-lossy"]
    assert result.selected_row.output_error == pytest.approx(0.004, rel=0.05)


def test_outputs_that_cannot_be_compared_break_every_budget_and_say_why() -> None:
    import math

    from tunetree.search.accuracy_check import EndToEndCheck

    def score(m) -> float:
        return 1.0

    for budget in (
        tt.AccuracyBudget(max_error=0.01),
        tt.AccuracyBudget(max_drop=0.1, evaluate=score),  # no output bound, still refused
    ):
        check = EndToEndCheck(budget, [], [], [], [], 1.0, None)
        reason = check._over(math.inf, [torch.ones(2)], [(torch.ones(2),)])
        assert reason.startswith("not comparable: ") and "structure differs" in reason
        assert check._over(0.001, [torch.ones(2)], [torch.ones(2)]) == ""
