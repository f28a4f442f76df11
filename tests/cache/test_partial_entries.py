"""A race the time budget cut short: kept as a partial entry that only a recorded plan loads."""

from __future__ import annotations

from pathlib import Path

import tunetree as tt
from tests.live import fakes


def test_a_race_cut_short_is_partial_a_lookup_misses_it_and_the_whole_race_replaces_it(
    tmp_path: Path,
) -> None:
    fakes.BUILDS.clear()
    cache = tt.TuningCache(tmp_path, remote=False)
    model, samples = fakes.model(), fakes.calls([1, 2, 3])
    options = fakes.budget_cut_options()  # Glacial is never built under a budget
    first = tt.auto_tune(model, samples, cache=cache, verbose=False, **options)
    first.undo()
    assert first.depth == 0 and fakes.BUILDS == ["Slow"]
    [entry] = cache.entries()
    assert cache.disk.read_manifest(entry.key).partial
    assert cache.stats.stored == 1

    fakes.BUILDS.clear()  # no budget: the lookup takes the partial entry for a miss
    whole = tt.auto_tune(
        model, samples, cache=cache, verbose=False, **{**options, "time_budget": None}
    )
    whole.undo()
    assert sorted(fakes.BUILDS) == ["Glacial", "Slow", "Slow"]
    assert cache.stats.hits == 0 and cache.stats.misses == 2 and cache.stats.stored == 2
    [again] = cache.entries()
    assert again.key == entry.key and not cache.disk.read_manifest(entry.key).partial

    fakes.BUILDS.clear()  # the whole entry now serves a budgeted tune as any hit
    hit = tt.auto_tune(model, samples, cache=cache, verbose=False, **options)
    hit.undo()
    assert fakes.BUILDS == [] and cache.stats.hits == 1
