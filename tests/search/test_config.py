"""tune and auto_tune read one frozen TuneConfig; their keywords build it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import tunetree as tt
from tests.fakes import Busy, Delayed, Shortcut, mlp
from tunetree.search import auto, tune
from tunetree.search.config import TuneConfig, settings

pytestmark = pytest.mark.usefixtures("virtual_time")

QUICK = tt.MeasureConfig.quick()


def _keywords() -> dict[str, Any]:
    return {
        "strategy": tt.HighestThroughputStrategy([Delayed(0.0, "fast"), tt.backends.Eager()]),
        "device": "cpu",
        "call": lambda m, x: m(x),
        "tolerances": tt.Tolerances(),
        "measure_config": QUICK,
        "cache": False,
        "dynamic_shapes": False,
        "allow_training": True,
        "verbose": False,
        "dry_run": True,
    }


def _captured(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[TuneConfig]:
    """Replace ``module.name`` (the entry point's resolved body) by one that records its config."""
    seen: list[TuneConfig] = []

    def record(model: Any, dataset: Any, *rest: Any) -> None:
        seen.extend(r for r in rest if isinstance(r, TuneConfig))

    monkeypatch.setattr(module, name, record)
    return seen


def test_keywords_and_config_give_the_same_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    kw = _keywords()
    seen = _captured(monkeypatch, tune, "_tune")
    tt.tune(mlp(), [], **kw)
    tt.tune(mlp(), [], config=tt.TuneConfig(**kw))
    tt.tune(mlp(), [], config=tt.TuneConfig(**kw), verbose=False, cache=False)  # agreeing
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2]
    assert seen[0].strategy is kw["strategy"] and seen[0].cache is False

    seen = _captured(monkeypatch, auto, "_auto_tune")
    tt.auto_tune(mlp(), [], **kw)
    tt.auto_tune(mlp(), [], config=tt.TuneConfig(**kw))
    assert len(seen) == 2 and seen[0] == seen[1]


def test_left_out_keywords_are_the_documented_defaults() -> None:
    config = settings(None)
    assert config == tt.TuneConfig()
    assert (config.verbose, config.dry_run, config.allow_training) == (True, False, False)
    assert config.strategy is None and config.cache is None and config.dynamic_shapes is None


def test_tune_with_config_decides_like_tune_with_keywords() -> None:
    model = mlp()
    data = [torch.randn(4, 16) for _ in range(2)]

    def keywords() -> dict[str, Any]:
        backends = [Delayed(0.003, "slow"), Delayed(0.0, "fast"), tt.backends.Eager()]
        strategy = tt.HighestThroughputStrategy(backends)
        return {"strategy": strategy, "measure_config": QUICK, "verbose": False, "cache": False}

    by_keywords = tt.tune(model, data, **keywords())
    by_config = tt.tune(model, data, config=tt.TuneConfig(**keywords()))
    for result in (by_keywords, by_config):
        winner = result.graphs[0].winner
        assert winner is not None and winner.backend.label == "fast"
        assert [r.status for r in result.graphs[0].rows] == [tt.Status.OK] * 3


def test_a_keyword_that_contradicts_config_is_refused() -> None:
    config = tt.TuneConfig(verbose=False, cache=False)
    with pytest.raises(tt.InvalidInputError, match=r"verbose=True \(config has False\)"):
        tt.tune(mlp(), [torch.randn(4, 16)], config=config, verbose=True)
    with pytest.raises(tt.InvalidInputError, match="contradict config"):
        tt.auto_tune(mlp(), [torch.randn(4, 16)], config=config, cache=True)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"strategy": "fast"}, tt.InvalidInputError),
        ({"device": 3}, tt.InvalidInputError),
        ({"measure_config": {"min_trials": 3}}, tt.InvalidInputError),
        ({"tolerances": 1e-3}, tt.InvalidInputError),
        ({"call": "forward"}, tt.InvalidInputError),
        ({"verbose": "no"}, tt.InvalidInputError),
        ({"dry_run": 1}, tt.InvalidInputError),
        ({"dynamic_shapes": True}, tt.InvalidInputError),
        ({"cache": 3}, tt.CacheError),
        ({"time_limit": 60}, tt.InvalidInputError),
    ],
)
def test_wrong_or_unknown_settings_get_a_typed_error(changes: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        tt.TuneConfig().replace(**changes)
    if "time_limit" not in changes:
        with pytest.raises(error):
            tt.TuneConfig(**changes)
        with pytest.raises(error):
            tt.tune(mlp(), [torch.randn(4, 16)], **changes)


def test_config_must_be_a_tune_config() -> None:
    with pytest.raises(tt.InvalidInputError, match=r"config must be a tt\.TuneConfig"):
        tt.auto_tune(mlp(), [torch.randn(4, 16)], config={"verbose": False})  # type: ignore[arg-type]


def test_tune_config_is_frozen() -> None:
    config = tt.TuneConfig(verbose=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.verbose = True  # type: ignore[misc]
    changed = config.replace(verbose=True)
    assert changed.verbose is True and config.verbose is False


def test_auto_tune_result_is_whole_when_constructed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing sets a field of the result after auto_tune built it."""
    assigned: list[str] = []
    original = tt.AutoTuneResult.__setattr__
    built: list[Any] = []

    def spy(self: Any, name: str, value: Any) -> None:
        if any(r is self for r in built):
            assigned.append(name)
        original(self, name, value)

    init = tt.AutoTuneResult.__init__

    def tracking_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(tt.AutoTuneResult, "__setattr__", spy)
    monkeypatch.setattr(tt.AutoTuneResult, "__init__", tracking_init)
    ms = 1e-3
    model = Busy(0.0, 10 * ms, [Busy(10 * ms, 5 * ms) for _ in range(2)]).eval()
    measure = tt.MeasureConfig(warmup_s=0.02, block_s=0.02, trials=7, max_s_per_candidate=0.4)
    result = tt.auto_tune(
        model,
        [torch.randn(2, 4)],
        strategy=tt.OneBackendStrategy(Shortcut()),
        measure_config=measure,
        max_depth=1,
        verbose=False,
        cache=False,
    )
    assert built == [result] and assigned == []
    assert result.breakdown is not None and result.time_budget == auto.DEFAULT_TIME_BUDGET_S
    assert result.depth is not None and result.plan.entries and result.tuning_s > 0
