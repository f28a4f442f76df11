"""The tuning cache in one process: keys, hits, faults, gc and the command line.

Every cache state lives on disk, so a new :class:`TuningCache` on the same directory and a
newly built model stand for a fresh process here; tests/test_cache_processes.py runs the
steps where real processes matter (kills, concurrency, edited source files).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import filelock
import pytest
import torch
from torch import nn

import tunetree as tt
from tests.cache import fakes as cache_fakes
from tests.cache.fakes import Counting, Flaky, Saving, tree
from tests.fakes import Failing
from tunetree.backends import Eager, Inductor
from tunetree.cache import TuningCache, default_directory, open_cache
from tunetree.cache import keys as cache_keys
from tunetree.cache.entry import EntryManifest
from tunetree.cache.maintenance import entry_info
from tunetree.cache.store import MANIFEST, CacheStore
from tunetree.candidates import measuring
from tunetree.candidates.evaluate import GraphSession, Status
from tunetree.search.tune import TuneResult
from tunetree.signature.graph import Graph, GraphKey, Sample

QUICK = tt.MeasureConfig.quick()


def data(*batches: int) -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randn(b, 8) for b in batches or (4,)]


def tune(
    model: nn.Module,
    cache: Any,
    inputs: list[torch.Tensor] | None = None,
    strategy: tt.Strategy | None = None,
    depth: int = 0,
) -> tuple[TuneResult, list[str]]:
    """Tune and check the outputs against eager; returns the result and the builds made."""
    inputs = inputs or data()
    cache_fakes.name_modules(model)
    cache_fakes.BUILDS.clear()
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    result = tt.tune(
        model,
        inputs,
        depth=depth,
        strategy=strategy or tt.FirstWinsStrategy([Saving(), Counting()]),
        measure_config=QUICK,
        verbose=False,
        cache=cache,
    )
    with torch.no_grad():
        for x, y in zip(inputs, expected, strict=True):
            torch.testing.assert_close(result.model(x), y)
    return result, list(cache_fakes.BUILDS)


def only_entry(directory: Path) -> Path:
    entries = list((directory / "entries").iterdir())
    assert len(entries) == 1, entries
    return entries[0]


def session_for(module: nn.Module, path: str = "") -> GraphSession:
    x = torch.randn(2, 8)
    with torch.no_grad():
        out = module(x)
    graph = Graph(Sample((x,)).key, [Sample((x,))], [out])
    return GraphSession(module, path, graph, torch.device("cpu"))


def key_of(module: nn.Module, strategy: tt.Strategy, path: str = "") -> str:
    return cache_keys.entry_identity(session_for(module, path), strategy).key


# --------------------------------------------------------------------------- keys


def test_config_order_does_not_change_the_key_an_option_does() -> None:
    module = tree()
    # Inductor takes its options as a dict (in any order) or as (name, value) pairs.
    ordered: Any = {"a": 1, "b": 2}
    reordered: Any = {"b": 2, "a": 1}
    changed: Any = {"a": 1, "b": 3}
    a = tt.MinLatencyStrategy([Inductor(options=ordered), Eager()])
    b = tt.MinLatencyStrategy([Inductor(options=reordered), Eager()])
    c = tt.MinLatencyStrategy([Inductor(options=changed), Eager()])
    d = tt.MinLatencyStrategy([Inductor(mode="max-autotune"), Eager()])
    assert key_of(module, a) == key_of(module, b)
    assert len({key_of(module, s) for s in (a, c, d)}) == 3
    assert cache_keys.canonical_json({"x": 1, "y": [1, 2]}) == cache_keys.canonical_json(
        {"y": [1, 2], "x": 1}
    )


def test_structure_keys_shapes_code_and_children_not_weights() -> None:
    base = cache_keys.structure_digest(tree(0))
    assert cache_keys.structure_digest(tree(1)) == base  # other weight values
    wider = tree()
    wider.a.lin = nn.Linear(8, 8, bias=False)
    assert cache_keys.structure_digest(wider) != base
    half = tree().to(torch.float64)
    assert cache_keys.structure_digest(half) != base
    norm = nn.LayerNorm(8)
    assert cache_keys.structure_digest(norm) != cache_keys.structure_digest(nn.LayerNorm(8, 1e-3))

    # A changed child changes its ancestors but not its siblings.
    edited = tree()
    edited.b.lin = nn.Linear(8, 8, dtype=torch.float64)
    assert cache_keys.structure_digest(edited.a) == cache_keys.structure_digest(tree().a)
    assert cache_keys.structure_digest(edited.b) != cache_keys.structure_digest(tree().b)
    assert cache_keys.structure_digest(edited) != base


def _class_with(body: str) -> type:
    namespace: dict[str, Any] = {"nn": nn, "torch": torch, "__name__": "edited"}
    exec(f"class Edited(nn.Module):\n    def forward(self, x):\n        {body}\n", namespace)
    return namespace["Edited"]


def test_code_identity_ignores_docstrings_and_lines_but_not_code() -> None:
    times2, times3 = _class_with("return x * 2"), _class_with("return x * 3")
    again = _class_with("return x * 2")
    documented = _class_with('"""Doubles."""\n        return x * 2')
    digest = cache_keys.class_code_digest
    assert digest(times2) == digest(again) == digest(documented)
    assert digest(times2) != digest(times3)


def test_hard_environment_is_keyed_soft_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    module, strategy = tree(), tt.FirstWinsStrategy([Eager()])
    real = cache_keys.environment
    base = key_of(module, strategy)

    def changed(field: str, value: Any) -> cache_keys.EnvironmentFn:
        def env(device: torch.device, kinds: list[str]) -> cache_keys.Environment:
            e = real(device, kinds)
            target = e.soft if field in e.soft else e.hard
            return cache_keys.Environment(
                {**e.hard, **({field: value} if target is e.hard else {})},
                {**e.soft, **({field: value} if target is e.soft else {})},
            )

        return env

    monkeypatch.setattr(cache_keys, "environment", changed("versions.torch", "0.0.1"))
    assert key_of(module, strategy) != base
    monkeypatch.setattr(cache_keys, "environment", changed("threads", 97))
    assert key_of(module, strategy) == base
    env = real(torch.device("cpu"), ["eager"])
    assert "versions.torch" in env.hard and "threads" in env.soft and "host" not in env.hard


# --------------------------------------------------------------------------- hits


def test_second_tune_builds_nothing_and_reproduces_the_rows(tmp_path: Path) -> None:
    first, builds = tune(tree(), TuningCache(tmp_path), depth=1)
    assert sorted(builds) == ["test-saving:a", "test-saving:b"]
    second, builds = tune(tree(), TuningCache(tmp_path), depth=1)
    assert builds == []
    for old, new in zip(first.graphs, second.graphs, strict=True):
        assert [(r.backend, r.status, r.reason) for r in old.rows] == [
            (r.backend, r.status, r.reason) for r in new.rows
        ]
        assert new.winner is not None and old.winner is not None
        assert new.winner.latency_s == old.winner.latency_s
        assert new.strategy.endswith("(cached)")
    cache = TuningCache(tmp_path)
    assert [i.hits for i in cache.entries()] == [1, 1]
    assert all(i.problem is None and i.artifacts for i in cache.entries())
    assert cache.verify() == []


def test_new_input_shape_tunes_only_the_new_graph(tmp_path: Path) -> None:
    tune(tree(), TuningCache(tmp_path), data(4))
    _, builds = tune(tree(), TuningCache(tmp_path), data(4, 6))
    assert builds == ["test-saving:"]
    assert len(list((tmp_path / "entries").iterdir())) == 2


def test_failed_candidates_are_remembered_not_rebuilt(tmp_path: Path) -> None:
    strategy = tt.FirstWinsStrategy([Failing(), Counting()])
    _, builds = tune(tree(), TuningCache(tmp_path), strategy=strategy)
    assert builds == ["test-counting:"]
    second, builds = tune(tree(), TuningCache(tmp_path), strategy=strategy)
    assert builds == []
    rows = second.graphs[0].rows
    assert rows[0].status is Status.FAILED and "exploded" in rows[0].reason
    assert second.graphs[0].winner is rows[1]


def test_a_graph_nothing_could_tune_is_cached_too(tmp_path: Path) -> None:
    strategy = tt.OneBackendStrategy(Failing())
    tune(tree(), TuningCache(tmp_path), strategy=strategy)
    cache = TuningCache(tmp_path)
    result, _ = tune(tree(), cache, strategy=strategy)
    assert cache.stats.hits == 1 and result.graphs[0].winner is None


def test_soft_change_remeasures_without_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    strategy = tt.MinLatencyStrategy([Saving(), Counting(delay_s=0.002)])
    tune(tree(), TuningCache(tmp_path), strategy=strategy)
    before = json.loads((only_entry(tmp_path) / MANIFEST).read_bytes().partition(b"\n")[2])
    real = cache_keys.environment

    def more_threads(device: torch.device, kinds: list[str]) -> cache_keys.Environment:
        e = real(device, kinds)
        return cache_keys.Environment(e.hard, {**e.soft, "threads": 97})

    monkeypatch.setattr(cache_keys, "environment", more_threads)
    cache = TuningCache(tmp_path)
    result, builds = tune(tree(), cache, strategy=strategy)
    assert builds == [] and cache.stats.remeasured == 1
    assert result.graphs[0].winner is not None
    assert result.graphs[0].winner.backend == Saving()
    after = json.loads((only_entry(tmp_path) / MANIFEST).read_bytes().partition(b"\n")[2])
    assert after["environment"]["soft"]["threads"] == 97
    assert after["entry_id"] != before["entry_id"]
    assert after["candidates"][0]["artifact"] == before["candidates"][0]["artifact"]
    cache = TuningCache(tmp_path)
    tune(tree(), cache, strategy=strategy)
    assert cache.stats.hits == 1 and cache.stats.remeasured == 0


def test_auto_tune_consults_the_cache(tmp_path: Path) -> None:
    strategy = tt.FirstWinsStrategy([Saving(), Counting()])
    kw: dict[str, Any] = {"strategy": strategy, "measure_config": QUICK, "verbose": False}
    cache_fakes.BUILDS.clear()
    model = tree()
    cache_fakes.name_modules(model)
    tt.auto_tune(model, data(), cache=tmp_path, **kw)
    assert len(cache_fakes.BUILDS) == 5  # root, a, b, a.lin, b.lin
    cache_fakes.BUILDS.clear()
    tt.auto_tune(tree(), data(), cache=str(tmp_path), **kw)
    assert cache_fakes.BUILDS == []


# --------------------------------------------------------------------------- faults


def _flip(path: Path, offset: int) -> None:
    os.chmod(path, 0o644)
    raw = bytearray(path.read_bytes())
    raw[offset % len(raw)] ^= 0x01
    path.write_bytes(bytes(raw))


def _artifact(directory: Path) -> Path:
    return max((p for p in (directory / "artifacts").glob("*/*")), key=lambda p: p.stat().st_size)


def _damage(directory: Path, how: str) -> None:
    entry = only_entry(directory)
    if how == "flip-artifact":
        _flip(_artifact(directory), 100)
    elif how == "truncate-artifact":
        path = _artifact(directory)
        os.chmod(path, 0o644)
        path.write_bytes(path.read_bytes()[:50])
    elif how == "delete-artifact":
        _artifact(directory).unlink()
    elif how == "flip-manifest":
        _flip(entry / MANIFEST, 200)
    elif how == "truncate-manifest":
        (entry / MANIFEST).write_bytes((entry / MANIFEST).read_bytes()[:100])
    elif how == "delete-manifest":
        (entry / MANIFEST).unlink()


@pytest.mark.parametrize(
    "how",
    [
        "flip-artifact",
        "truncate-artifact",
        "delete-artifact",
        "flip-manifest",
        "truncate-manifest",
        "delete-manifest",
    ],
)
def test_damaged_entry_is_skipped_marked_and_retuned(tmp_path: Path, how: str) -> None:
    tune(tree(), TuningCache(tmp_path))
    _damage(tmp_path, how)
    key = only_entry(tmp_path).name
    cache = TuningCache(tmp_path)
    bad = [i for i in cache.entries(deep=True) if i.problem]
    assert len(bad) == 1, "verify must see the damage"
    _, builds = tune(tree(), cache)  # outputs are checked inside
    assert builds == ["test-saving:"] and cache.stats.invalid >= 1
    # The reader only marked it; the writer replaced it with a good entry.
    assert only_entry(tmp_path).name == key and cache.verify() == []
    cache = TuningCache(tmp_path)
    _, builds = tune(tree(), cache)
    assert builds == [] and cache.stats.hits == 1


def test_reader_marks_but_never_deletes(tmp_path: Path) -> None:
    tune(tree(), TuningCache(tmp_path))
    _damage(tmp_path, "flip-artifact")
    entry = only_entry(tmp_path)
    cache = TuningCache(tmp_path)
    strategy = tt.FirstWinsStrategy([Saving(), Counting()])
    model = tree()
    info = tt.inspect(model, data())
    graph = next(iter(info.modules[""].graphs.values()))
    session = GraphSession(model, "", graph, torch.device("cpu"))
    assert cache.lookup(session, strategy) is None
    cache.close()
    assert entry.exists() and (tmp_path / "invalid" / entry.name).exists()
    assert "marked invalid" in (TuningCache(tmp_path).entries()[0].problem or "")


def _rewrite(entry: Path, change: Any) -> None:
    body = json.loads((entry / MANIFEST).read_bytes().partition(b"\n")[2])
    change(body)
    CacheStore(entry.parent.parent).write_manifest(entry, EntryManifest.from_json(body))


@pytest.mark.parametrize("field", ["schema", "environment", "candidates"])
def test_entry_from_another_schema_or_environment_is_skipped(tmp_path: Path, field: str) -> None:
    tune(tree(), TuningCache(tmp_path))

    def change(body: dict[str, Any]) -> None:
        if field == "schema":
            body["schema"] = cache_keys.SCHEMA + 1
        elif field == "environment":
            body["environment"]["hard"]["versions.torch"] = "1.0"
        else:
            body["candidates"][0]["backend"]["config"]["delay_s"] = 9.0

    _rewrite(only_entry(tmp_path), change)
    cache = TuningCache(tmp_path)
    _, builds = tune(tree(), cache)
    assert builds == ["test-saving:"] and cache.stats.invalid == 1
    assert TuningCache(tmp_path).verify() == []  # replaced by a good entry


def test_bumped_schema_or_library_version_retunes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tune(tree(), TuningCache(tmp_path))
    monkeypatch.setattr(cache_keys, "SCHEMA", cache_keys.SCHEMA + 1)
    _, builds = tune(tree(), TuningCache(tmp_path))
    assert builds == ["test-saving:"]
    real = cache_keys.environment

    def upgraded(device: torch.device, kinds: list[str]) -> cache_keys.Environment:
        e = real(device, kinds)
        return cache_keys.Environment({**e.hard, "versions.torch": "99.0"}, e.soft)

    monkeypatch.setattr(cache_keys, "environment", upgraded)
    _, builds = tune(tree(), TuningCache(tmp_path))
    assert builds == ["test-saving:"]
    assert len(list((tmp_path / "entries").iterdir())) == 3


def test_backend_that_no_longer_loads_gives_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranked = tt.MinLatencyStrategy([Flaky(), Counting(delay_s=0.003)])
    first, _ = tune(tree(), TuningCache(tmp_path), strategy=ranked)
    assert first.graphs[0].winner is not None and first.graphs[0].winner.backend == Flaky()
    alone = tt.OneBackendStrategy(Flaky())
    tune(tree(), TuningCache(tmp_path), strategy=alone)

    monkeypatch.setenv(cache_fakes.GONE_ENV, "1")
    result, builds = tune(tree(), TuningCache(tmp_path), strategy=ranked)
    assert builds == []  # the next recorded candidate serves
    rows = result.graphs[0].rows
    assert rows[0].status is Status.FAILED and "flaky_runtime" in rows[0].reason
    assert result.graphs[0].winner is rows[1]
    _, builds = tune(tree(), TuningCache(tmp_path), strategy=alone)
    assert builds == ["test-flaky:"]  # no other candidate: tuned again


def test_changed_weights_are_caught_by_revalidation(tmp_path: Path) -> None:
    tune(tree(0), TuningCache(tmp_path))
    cache = TuningCache(tmp_path)
    _, builds = tune(tree(1), cache)  # Saving bakes weights: its old artifact is stale
    assert builds == ["test-saving:"] and cache.stats.invalid == 1
    cache = TuningCache(tmp_path)
    _, builds = tune(tree(1), cache)
    assert builds == [] and cache.stats.hits == 1
    # The replaced entry's edge to the old weights is gone: gc drops that artifact.
    old_weights = {p.name for p in (tmp_path / "artifacts").glob("*/*")} - set(
        cache.entries()[0].artifacts
    )
    assert len(old_weights) == 1
    report = cache.gc()
    assert report.artifacts == 1 and not any(
        (tmp_path / "artifacts" / sha[:2] / sha).exists() for sha in old_weights
    )


def test_cache_problems_never_break_tuning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = TuningCache(tmp_path)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk full")

    monkeypatch.setattr(cache.disk, "new_temporary", broken)
    _, builds = tune(tree(), cache)
    assert builds == ["test-saving:"] and not list((tmp_path / "entries").iterdir())
    monkeypatch.setattr(cache_keys, "entry_identity", broken)
    _, builds = tune(tree(), TuningCache(tmp_path))
    assert builds == ["test-saving:"]


# --------------------------------------------------------------------------- store


def _staging(store: CacheStore, key: str, marker: str) -> Path:
    staging = store.new_temporary("entry")
    manifest = EntryManifest(1, key, marker, 0.0, "", "", "", {}, {}, "", None, {}, {}, [], None)
    store.write_manifest(staging, manifest)
    return staging


def test_publishing_twice_keeps_one_entry(tmp_path: Path) -> None:
    store = CacheStore(tmp_path)
    first, second = _staging(store, "k", "first"), _staging(store, "k", "second")
    assert store.publish(first, "k", lambda body: True)
    assert not store.publish(second, "k", lambda body: True)  # loser validates, discards
    assert store.read_manifest("k").entry_id == "first"
    assert not second.exists() and list(store.tmp.iterdir()) == []
    # An existing entry that is not valid for us is replaced.
    third = _staging(store, "k", "third")
    assert store.publish(third, "k", lambda body: False)
    assert store.read_manifest("k").entry_id == "third"


def test_gc_removes_orphans_invalid_entries_and_unreferenced_artifacts(tmp_path: Path) -> None:
    tune(tree(), TuningCache(tmp_path), depth=1)
    store = CacheStore(tmp_path)
    dead = store.tmp / "entry.otherhost.1.abc"
    dead.mkdir()
    os.utime(dead, (0, 0))
    (store.tmp / "garbage").mkdir()
    stray = store.artifacts / "ab" / ("ab" + "0" * 62)
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(b"orphan")
    os.utime(stray, (0, 0))
    keys = store.entry_keys()
    store.markers.mark_invalid(keys[0], store.read_manifest(keys[0]).entry_id, "test")
    report = TuningCache(tmp_path).gc()
    assert report.temporaries == 2 and report.invalid_entries == 1 and report.artifacts >= 1
    assert not stray.exists() and list(store.tmp.iterdir()) == []
    assert store.entry_keys() == keys[1:]
    assert TuningCache(tmp_path).verify() == []


def test_gc_max_size_evicts_least_recently_used(tmp_path: Path) -> None:
    tune(tree(), TuningCache(tmp_path), data(4))
    tune(tree(), TuningCache(tmp_path), data(6))
    store = CacheStore(tmp_path)
    old, new = sorted(store.entry_keys(), key=lambda k: entry_info(store, k).created)
    os.utime(store.hits / new, (1, 1))  # the newer entry was used long ago
    size = entry_info(store, old).size
    report = TuningCache(tmp_path).gc(max_size=size + 100)
    assert report.evicted_entries == 1 and store.entry_keys() == [old]
    assert store.size() <= size + 100 + 4096
    TuningCache(tmp_path).gc(max_size=0)
    assert store.entry_keys() == [] and list(store.artifacts.glob("*/*")) == []


# --------------------------------------------------------------------------- arguments, CLI


def test_open_cache_arguments(tmp_path: Path) -> None:
    assert open_cache(False) is None
    default = open_cache(None)
    assert isinstance(default, TuningCache) and default.directory == default_directory()
    assert default_directory() == Path(os.environ["TUNETREE_CACHE_DIR"])
    assert isinstance(open_cache(True), TuningCache)
    assert open_cache(tmp_path).directory == tmp_path  # type: ignore[union-attr]
    mine = TuningCache(tmp_path)
    assert open_cache(mine) is mine
    with pytest.raises(tt.CacheError):
        open_cache(42)
    (tmp_path / "file").write_text("")
    with pytest.raises(tt.CacheError):
        TuningCache(tmp_path / "file" / "cache")


def test_cache_false_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNETREE_CACHE_DIR", str(tmp_path / "default"))
    tune(tree(), False)
    assert not (tmp_path / "default").exists()
    tune(tree(), None)
    assert len(list((tmp_path / "default" / "entries").iterdir())) == 1


def test_device_lock_is_exclusive(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path)
    with cache.device_lock("cpu"):
        other = filelock.FileLock(str(tmp_path / "locks" / "device-cpu.lock"))
        with pytest.raises(filelock.Timeout):
            other.acquire(timeout=0)
    other.acquire(timeout=0)
    other.release()


def test_measurements_of_a_miss_hold_the_device_lock(tmp_path: Path) -> None:
    held: list[bool] = []
    lock_file = str(tmp_path / "locks" / "device-cpu.lock")

    class Probe(Counting):
        def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Any:
            inner = super().build(module, graph, device)

            def call(*args: Any, **kwargs: Any) -> Any:
                try:
                    filelock.FileLock(lock_file).acquire(timeout=0).lock.release()
                    held.append(False)
                except filelock.Timeout:
                    held.append(True)
                return inner(*args, **kwargs)

            return _Calls(inner.backend, call)

    tune(tree(), TuningCache(tmp_path), strategy=tt.OneBackendStrategy(Probe()))
    assert held[0] is False and any(held)  # checked against eager unlocked, timed locked


class _Calls(tt.backends.Runner):
    def __init__(self, backend: Any, fn: Any) -> None:
        super().__init__(backend)
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def test_cli_ls_verify_gc(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tunetree.cli import main

    tune(tree(), TuningCache(tmp_path), depth=1)
    tune(tree(), TuningCache(tmp_path), depth=1)
    assert main(["cache", "--dir", str(tmp_path), "ls"]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and "test-saving" in out and " 1 " in out
    assert main(["cache", "--dir", str(tmp_path), "verify"]) == 0
    _flip(_artifact(tmp_path), 10)
    capsys.readouterr()
    assert main(["cache", "--dir", str(tmp_path), "verify"]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and "corrupted" in out and "1 unusable" in out
    assert main(["cache", "--dir", str(tmp_path), "gc", "--max-size", "1G"]) == 0
    assert "1 invalid entries" in capsys.readouterr().out
    assert main(["cache", "--dir", str(tmp_path), "ls", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1


# --------------------------------------------------------------------------- measurement lock


def test_batch_size_search_measures_under_the_device_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a miss every measurement, those of the batch-size search's derived sessions
    included, runs inside the cache's device lock."""
    held: list[bool] = []
    inside = [False]

    @contextlib.contextmanager
    def recording_lock(self: TuningCache, device: Any) -> Iterator[None]:
        inside[0] = True
        try:
            yield
        finally:
            inside[0] = False

    real_measure = measuring.measure

    def spy(calls: Any, device: Any, config: Any, *rest: Any) -> Any:
        held.append(inside[0])
        return real_measure(calls, device, config, *rest)

    monkeypatch.setattr(TuningCache, "device_lock", recording_lock)
    monkeypatch.setattr(measuring, "measure", spy)
    strategy = tt.HighestThroughputStrategy(
        [tt.backends.Eager()], search_max_batch_size=True, max_batch_size=8
    )
    tt.tune(
        tree(),
        data(2),
        strategy=strategy,
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=TuningCache(tmp_path),
    )
    assert len(held) >= 2, "the search measured no larger batch"
    assert all(held), f"measured outside the device lock: {held}"


# --- ranges (issue 12)


def test_cache_hit_keeps_the_range_and_a_wider_range_is_tuned_again(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path)
    first, builds = tune(tree(), cache, data(2, 4))
    assert str(first.graphs[0].graph.key) == "(f32[batch 2..4, 8])"
    assert builds
    again, builds = tune(tree(), TuningCache(tmp_path), data(2, 4))
    assert builds == []  # a hit
    assert str(again.graphs[0].graph.key) == "(f32[batch 2..4, 8])"
    with torch.no_grad():  # batch 3 was never recorded: the cached runner serves it
        x = torch.randn(3, 8)
        assert again.model.forward.route(GraphKey.of((x,), {})) is not None
        torch.testing.assert_close(again.model(x), tree()(x))
    # a range wider than the cached entry's is not served by it: tuned again
    wider, builds = tune(tree(), TuningCache(tmp_path), data(2, 8))
    assert str(wider.graphs[0].graph.key) == "(f32[batch 2..8, 8])"
    assert builds


def test_an_entry_for_a_wider_range_serves_a_narrower_range_and_a_shape_inside_it(
    tmp_path: Path,
) -> None:
    cache = TuningCache(tmp_path)
    wide, builds = tune(tree(), cache, data(2, 8))
    assert builds and str(wide.graphs[0].graph.key) == "(f32[batch 2..8, 8])"
    # a narrower range: served by the wider entry, nothing built, outputs checked by tune()
    narrow, builds = tune(tree(), TuningCache(tmp_path), data(3, 5))
    assert builds == []
    result = narrow.graphs[0]
    assert str(result.graph.key) == "(f32[batch 3..5, 8])"
    assert "cached for (f32[batch 2..8, 8])" in result.strategy
    assert result.winner is not None and result.winner.backend.kind == "test-saving"
    # one exact shape inside the range: served too
    exact, builds = tune(tree(), TuningCache(tmp_path), data(6))
    assert builds == [] and "cached for" in exact.graphs[0].strategy
    # a range that reaches outside: tuned again
    _, builds = tune(tree(), TuningCache(tmp_path), data(1, 4))
    assert builds


def test_only_ranged_entries_join_a_family(tmp_path: Path) -> None:
    tune(tree(), TuningCache(tmp_path), data(4))  # one exact shape: covers only itself
    assert list((tmp_path / "families").iterdir()) == []
    tune(tree(), TuningCache(tmp_path), data(2, 8))
    assert len(list((tmp_path / "families").iterdir())) == 1


def test_gc_drops_family_records_of_removed_entries(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path)
    tune(tree(), cache, data(2, 8))
    families = list((tmp_path / "families").iterdir())
    assert len(families) == 1 and len(list(families[0].iterdir())) == 1
    cache.gc(max_size=0)  # evicts every entry
    assert list((tmp_path / "families").iterdir()) == []
    # with the record gone, a narrower range is a plain miss
    _, builds = tune(tree(), TuningCache(tmp_path), data(3, 5))
    assert builds
