"""A poisoned tuning cache (issue 29): an entry whose winner's weights were changed only in
directions the recorded samples cannot see, re-hashed and resealed, so that ``cache verify``
passes and the recorded samples still match eager. A hit is checked like a fresh build, on
the samples and on value probes, so the entry is refused and the graph tuned again."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import tunetree as tt
from tests.cache import fakes
from tests.cache.poison import manifest_body, poison_openvino, poison_safetensors
from tests.checkpoint.fixtures.make_fixtures import inputs, model
from tunetree.cache.store import CacheStore
from tunetree.cli import main as cli_main


def _unseen(width: int, rows: int = 16) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(123))


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="needs openvino")
def test_a_poisoned_openvino_entry_is_refused_and_tuned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OpenVINO entry, its first weight poisoned in the null space of
    the recorded inputs: before, the next tune was a hit whose model matched eager on the
    samples (6e-8) and was off by about 0.9 on unseen inputs."""
    directory = tmp_path / "cache"
    tune = functools.partial(
        tt.tune,
        strategy=tt.OneBackendStrategy(tt.backends.OpenVINO()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
    )
    tune(model(), inputs(), cache=tt.TuningCache(directory))  # the entry to poison
    store = CacheStore(directory)
    (key,) = store.entry_keys()
    body = manifest_body(store, key)
    poison_openvino(store, key, torch.cat(inputs()), shape=[16, 8])
    assert cli_main(["cache", "--dir", str(directory), "verify"]) == 0  # checksums hold

    cache = tt.TuningCache(directory)
    result = tune(model(), inputs(), cache=cache)
    assert cache.stats.hits == 0 and cache.stats.invalid == 1, cache.stats
    assert not result.graphs[0].strategy.endswith("(cached)")
    unseen = _unseen(8)
    with torch.no_grad():
        for x in [*inputs(), unseen]:
            torch.testing.assert_close(result.model(x[:2]), model()(x[:2]), atol=1e-4, rtol=1e-4)
    assert store.markers.is_marked_invalid(key, body["entry_id"])


def _tune_tree(cache: tt.TuningCache, data: list[torch.Tensor]) -> Any:
    fakes.BUILDS.clear()
    tree = fakes.tree()
    fakes.name_modules(tree)
    return tt.tune(
        tree,
        data,
        depth=1,
        strategy=tt.MinLatencyStrategy([fakes.Saving(), fakes.Counting(delay_s=0.002)]),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=cache,
    )


def _entry_of(store: CacheStore, path: str) -> str:
    (key,) = [k for k in store.entry_keys() if manifest_body(store, k)["path"] == path]
    return key


def test_a_poisoned_twin_entry_is_refused_and_tuned_again(tmp_path: Path) -> None:
    """``b`` is the twin of ``a`` (same structure and graph): its entry is the narrowed race.
    Its weights poisoned in the null space of its recorded inputs (``a``'s outputs): before,
    the twin was served from the cache, 0.5 off on unseen inputs."""
    data = [torch.randn(4, 8, generator=torch.Generator().manual_seed(5))]
    first = _tune_tree(tt.TuningCache(tmp_path / "cache"), data)
    assert "twin of a" in next(g for g in first.graphs if g.path == "b").strategy
    store = CacheStore(tmp_path / "cache")
    with torch.no_grad():
        seen = fakes.tree().a(data[0])
    poison_safetensors(store, _entry_of(store, "b"), "lin.weight", seen)

    cache = tt.TuningCache(tmp_path / "cache")
    second = _tune_tree(cache, data)
    assert fakes.BUILDS == ["test-saving:b"], fakes.BUILDS  # only the poisoned twin again
    assert cache.stats.hits == 1 and cache.stats.invalid == 1, cache.stats
    unseen = _unseen(8)
    with torch.no_grad():
        torch.testing.assert_close(second.model(unseen), fakes.tree()(unseen))


def test_a_twin_served_from_the_cache_keeps_its_cached_mark(tmp_path: Path) -> None:
    data = [torch.randn(4, 8, generator=torch.Generator().manual_seed(5))]
    _tune_tree(tt.TuningCache(tmp_path / "cache"), data)
    second = _tune_tree(tt.TuningCache(tmp_path / "cache"), data)
    assert fakes.BUILDS == []
    strategies = {g.path: g.strategy for g in second.graphs}
    assert strategies["a"].endswith("(cached)"), strategies
    assert "twin of a" in strategies["b"] and "(cached)" in strategies["b"], strategies
    table = second.table()
    assert "a (cached)" in table and "b (cached)" in table, table


def test_a_hit_is_checked_on_probes_as_a_fresh_build_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check a hit runs is the session's own probe check (one rule for both)."""
    from tunetree.candidates.evaluate import GraphSession

    data = [torch.randn(4, 8, generator=torch.Generator().manual_seed(5))]
    _tune_tree(tt.TuningCache(tmp_path / "cache"), data)
    probed: list[str] = []
    real = GraphSession.probe_failure

    def spy(self: GraphSession, runner: Any) -> str | None:
        probed.append(self.path)
        return real(self, runner)

    monkeypatch.setattr(GraphSession, "probe_failure", spy)
    cache = tt.TuningCache(tmp_path / "cache")
    _tune_tree(cache, data)
    assert cache.stats.hits == 2 and sorted(probed) == ["a", "b"]
    assert json.dumps(cache.stats.__dict__)  # nothing else changed
