"""The typed cache-entry manifest: round trip, malformed fields refused by name, and a
malformed entry treated like any other fault (marked invalid, the graph tuned again)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import tunetree as tt
from tests.cache.fakes import Saving, tree
from tests.cache.test_cache import data, only_entry, tune
from tunetree.cache import EntryFault, EntryManifest, MalformedEntryError, TuningCache
from tunetree.cache.store import MANIFEST, CacheStore


def _body(entry: Path) -> dict[str, Any]:
    return json.loads((entry / MANIFEST).read_bytes().partition(b"\n")[2])


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    tune(tree(), TuningCache(tmp_path), strategy=tt.MinLatencyStrategy([Saving(), Saving(0.01)]))
    body = _body(only_entry(tmp_path))
    manifest = EntryManifest.from_json(body)
    assert manifest.to_json() == body
    assert manifest.winner is not None and manifest.candidates[manifest.winner].files


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda b: b.update(schema="1"), "schema"),
        (lambda b: b.pop("entry_id"), "entry_id"),
        (lambda b: b["environment"].update(hard=[]), "environment.hard"),
        (lambda b: b["candidates"][0].update(status="great"), "candidates[0].status"),
        (lambda b: b["candidates"][0]["backend"].pop("kind"), "candidates[0].backend.kind"),
        (lambda b: b["candidates"][0]["timing"].update(trials=1.5), "candidates[0].timing.trials"),
        (
            lambda b: b["candidates"][0]["artifact"]["files"][0].update(size="big"),
            "candidates[0].artifact.files[0].size",
        ),
        (lambda b: b.update(winner=5), "winner"),
    ],
)
def test_malformed_field_is_refused_by_name(tmp_path: Path, change: Any, field: str) -> None:
    tune(tree(), TuningCache(tmp_path))
    body = _body(only_entry(tmp_path))
    change(body)
    with pytest.raises(MalformedEntryError) as err:
        EntryManifest.from_json(body)
    assert f"'{field}'" in str(err.value)
    assert isinstance(err.value, EntryFault) and isinstance(err.value, tt.CacheError)


def test_malformed_entry_is_marked_invalid_and_tuned_again(tmp_path: Path) -> None:
    tune(tree(), TuningCache(tmp_path), data())
    entry = only_entry(tmp_path)
    body = _body(entry)
    body["candidates"][0]["status"] = "great"
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    (entry / MANIFEST).write_bytes(hashlib.sha256(raw).hexdigest().encode() + b"\n" + raw)
    with pytest.raises(MalformedEntryError, match="candidates"):
        CacheStore(tmp_path).read_manifest(entry.name)
    cache = TuningCache(tmp_path)
    _, builds = tune(tree(), cache, data())
    assert builds == ["test-saving:"] and cache.stats.invalid == 1 and cache.stats.hits == 0
