"""generate's whole-model trial comes first, inspects only the root, and watches the budget.

Decisions only: the trial is faked where its speed or outcome would decide, so nothing here
depends on how fast the machine is.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("openvino")

import tunetree as tt  # noqa: E402
import tunetree.search.auto as auto  # noqa: E402
import tunetree.search.stateful_first as first  # noqa: E402
from tunetree.candidates.budget import TIME_BUDGET_ERROR  # noqa: E402
from tunetree.candidates.measure import Timing  # noqa: E402
from tunetree.generation.stateful import StatefulConfig  # noqa: E402
from tunetree.generation.stateful_trial import StatefulTrial, try_stateful  # noqa: E402
from tunetree.signature.graph import Sample  # noqa: E402

GEN = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
SMALL = dict(
    vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
)  # fmt: skip


class Stop(Exception):
    """Ends auto_tune where the test has seen what it asks (carries what was seen)."""


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SMALL)).eval()


def _prompt(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (batch, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _call(m: Any, **x: Any) -> Any:
    return m.generate(**x, **GEN)


def _tune(model: torch.nn.Module, **kwargs: Any) -> Any:
    return tt.auto_tune(
        model,
        [_prompt(1, 6, 1), _prompt(2, 9, 2)],
        call=_call,
        strategy=tt.OneBackendStrategy(tt.backends.OpenVINO()),
        cache=False,
        verbose=False,
        **kwargs,
    )


@pytest.fixture
def depths(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The depth each inspection of auto_tune went down to, in order."""
    seen: list[int] = []
    real = auto.inspect

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["max_depth"])
        return real(*args, **kwargs)

    monkeypatch.setattr(auto, "inspect", spy)
    return seen


def _trial(chosen: bool) -> StatefulTrial:
    trial = StatefulTrial(StatefulConfig(), status="chosen" if chosen else "measured")
    trial.timing = Timing(0.5 if chosen else 2.0, 0.5, 0.5, 0.5, 3, 1)
    trial.untuned = Timing(1.0, 1.0, 1.0, 1.0, 3, 1)
    trial.chosen = chosen
    trial.model = torch.nn.Identity() if chosen else None
    return trial


def _no_depth_search(*args: Any, **kwargs: Any) -> Any:
    raise Stop(args[0])  # the DepthRun


def test_a_winning_whole_model_trial_inspects_the_root_only_and_tunes_no_depth(
    monkeypatch: pytest.MonkeyPatch, depths: list[int]
) -> None:
    won = _trial(chosen=True)
    monkeypatch.setattr(first, "try_stateful", lambda *a, **k: [won])
    monkeypatch.setattr(auto, "_search", _no_depth_search)
    result = _tune(_model(), time_budget=None)
    assert depths == [0]  # before any depth is inspected, and none after
    assert result.model is won.model and result.stateful == [won]
    assert result.rows and all(r.status is auto.DepthStatus.SKIPPED for r in result.rows)
    assert all("not inspected" in r.error for r in result.rows)


def test_a_losing_whole_model_trial_is_followed_by_every_depths_inspection_and_search(
    monkeypatch: pytest.MonkeyPatch, depths: list[int]
) -> None:
    monkeypatch.setattr(first, "try_stateful", lambda *a, **k: [_trial(chosen=False)])
    monkeypatch.setattr(auto, "_search", _no_depth_search)
    with pytest.raises(Stop) as stopped:
        _tune(_model(), time_budget=None)
    run = stopped.value.args[0]
    assert depths == [0, auto.MAX_DEFAULT_DEPTH]
    assert run.info.max_depth >= 1 and run.generation


def test_a_model_it_does_not_apply_to_is_inspected_once_at_every_depth(
    monkeypatch: pytest.MonkeyPatch, depths: list[int]
) -> None:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the whole-model trial ran where it does not apply")

    monkeypatch.setattr(first, "try_stateful", never)
    monkeypatch.setattr(auto, "_search", _no_depth_search)
    with pytest.raises(Stop):
        _tune(_model(), time_budget=None, savable=True)
    assert depths == [auto.MAX_DEFAULT_DEPTH]


@pytest.mark.parametrize(("budget", "runs"), [(300.0, False), (None, True)])
def test_too_little_budget_left_skips_the_trial_with_a_reason_row(
    monkeypatch: pytest.MonkeyPatch, depths: list[int], budget: float | None, runs: bool
) -> None:
    tried: list[bool] = []

    def fake_try(*args: Any, **kwargs: Any) -> list[StatefulTrial]:
        tried.append(True)
        return [_trial(chosen=False)]

    def finish(*args: Any) -> Any:
        raise Stop(args[-2])  # the stateful trials (then the GPU loop's), as the result holds them

    monkeypatch.setattr(first, "expected_s", lambda model, pass_s: 1e6)
    monkeypatch.setattr(first, "try_stateful", fake_try)
    monkeypatch.setattr(auto, "_search", lambda *a: Timing(1.0, 1.0, 1.0, 1.0, 3, 1))
    monkeypatch.setattr(auto, "_finish", finish)
    with pytest.raises(Stop) as stopped:
        _tune(_model(), time_budget=budget)
    trials = stopped.value.args[0]
    assert bool(tried) is runs  # an unlimited budget has room for anything
    if not runs:
        assert trials and all(t.status == "skipped" for t in trials)
        assert all("time budget" in t.reason and "expected" in t.reason for t in trials)
    assert depths == [0, auto.MAX_DEFAULT_DEPTH]  # the depths still get what is left


def test_a_budget_spent_by_the_trial_stops_there_with_the_depths_skipped(
    monkeypatch: pytest.MonkeyPatch, depths: list[int]
) -> None:
    lost = _trial(chosen=False)
    monkeypatch.setattr(first, "try_stateful", lambda *a, **k: [lost])
    monkeypatch.setattr(first, "expected_s", lambda model, pass_s: 0.0)  # the trial starts
    monkeypatch.setattr(auto, "_search", _no_depth_search)  # nor is the untuned model timed
    model = _model()
    result = _tune(model, time_budget=1e-3)
    assert depths == [0]  # nothing deeper inspected
    assert result.model is model and result.depth is None and result.stateful == [lost]
    assert result.rows and all(r.error == TIME_BUDGET_ERROR for r in result.rows)
    assert [s.what for s in result.skipped()] == ["depth"] * len(result.rows)


class _Spent:
    """A deadline already passed: no time left for anything after the first config."""

    def left_s(self) -> float:
        return 0.0

    def passed(self) -> bool:
        return True


def test_inside_the_trial_a_spent_budget_skips_later_configs_and_the_measurement() -> None:
    model = _model()
    samples = [Sample((), _prompt(1, 6, 1)), Sample((), _prompt(2, 9, 2))]

    def measure(models: dict) -> dict:
        raise AssertionError("measured after the deadline")

    trials = try_stateful(
        model,
        samples,
        _call,
        measure,
        accuracy=tt.AccuracyBudget(max_error=0.5),
        deadline=_Spent(),  # type: ignore[arg-type]
    )
    assert len(trials) >= 2
    head, *rest = trials
    assert head.report is not None and head.report.ok  # the first config is built and checked
    assert head.status == "skipped" and "before it was measured" in head.reason
    assert head.model is None and not any(t.chosen for t in trials)
    assert all(t.status == "skipped" and TIME_BUDGET_ERROR in t.reason for t in rest)
    assert all(t.report is None for t in rest)  # not built
