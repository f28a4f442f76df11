"""The typed checkpoint manifest: round trip, and every malformed field refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tunetree as tt
from tests.checkpoint.fixtures.make_fixtures import HERE, model
from tests.checkpoint.test_checkpoint import Parts, rewrite
from tunetree.checkpoint import Manifest, ManifestError
from tunetree.checkpoint.reader import open_source, read_header, read_manifest
from tunetree.runtime.artifacts import BackendRecord


def _fixture_manifest() -> dict[str, Any]:
    path = HERE / "v1_eager.tt"
    header = read_header(path)
    with open_source(path, header) as source:
        return read_manifest(source, header).to_json()


def test_round_trip_keeps_every_field() -> None:
    data = _fixture_manifest()
    manifest = Manifest.from_json(data)
    assert manifest.depth == 0 and manifest.entries[0].backend.kind == "eager"
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert manifest.to_json() == data


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["entries"][0]["backend"].update(kind=7), "entries[0].backend.kind"),
        (lambda d: d["entries"][0]["backend"].update(kind="../x"), "entries[0].backend.kind"),
        (lambda d: d["entries"][0].pop("runner"), "entries[0].runner"),
        (lambda d: d["entries"][0].update(latency_s="fast"), "entries[0].latency_s"),
        (lambda d: d["entries"][0].update(graph={"args": 3}), "entries[0].graph"),
        (lambda d: d["members"]["weights.safetensors"].update(size=-1), "size"),
        (lambda d: d.update(depth=True), "depth"),
        (lambda d: d.update(entries={}), "entries"),
        (lambda d: d["weights"].update(member="nowhere"), "weights.member"),
    ],
)
def test_malformed_field_is_refused_by_name(change: Any, field: str) -> None:
    data = json.loads(json.dumps(_fixture_manifest()))
    change(data)
    with pytest.raises(ManifestError, match="malformed") as err:
        Manifest.from_json(data)
    assert field in str(err.value)
    assert isinstance(err.value, tt.CheckpointError)


def test_load_refuses_a_malformed_manifest_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "m.tt"
    tt.save(_tuned(), path)

    def bad_backend(parts: Parts) -> None:
        manifest = parts.manifest
        manifest["entries"][0]["backend"]["config"] = ["not", "an", "object"]
        parts.manifest = manifest

    rewrite(path, bad_backend)
    with pytest.raises(ManifestError, match=r"entries\[0\]\.backend\.config"):
        tt.load(model(), path, ignore=("host",))


def _tuned() -> Any:
    from tests.checkpoint.fixtures.make_fixtures import inputs

    return tt.tune(
        model(),
        inputs(),
        strategy=tt.OneBackendStrategy(tt.backends.Eager()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )


def test_backend_record_reads_both_first_release_shapes() -> None:
    from_checkpoint = BackendRecord.from_json(
        {"kind": "eager", "name": "eager", "config": {}}, "backend", ManifestError
    )
    from_cache = BackendRecord.from_json(
        {"kind": "eager", "class": "tunetree.backends.eager.Eager", "config": {}},
        "backend",
        ManifestError,
    )
    assert from_checkpoint.backend() == from_cache.backend() == tt.backends.Eager()
    assert from_cache.to_json()["class"] == "tunetree.backends.eager.Eager"  # read as written
    assert BackendRecord.of(tt.backends.Eager()).to_json() == {
        "kind": "eager",
        "class": "tunetree.Eager",
        "config": {},
    }
    assert (
        from_checkpoint.to_json()
        == BackendRecord.of(tt.backends.Eager(), for_checkpoint=True).to_json()
    )


def test_an_accuracy_record_is_read_field_by_field_and_refused_when_malformed() -> None:
    from tunetree._util.records import Fields
    from tunetree.checkpoint.format import accuracy_note, read_accuracy

    good = {
        "accuracy": {
            "budget": {"metric": "rel_l2", "max_error": 0.01, "holdout": 0.25},
            "error": 0.002,
            "changes_results": True,
            "extra": "ignored",
        }
    }
    record = read_accuracy(Fields(good, "", ManifestError))
    assert record is not None and record["budget"]["max_error"] == 0.01
    assert "extra" not in record
    assert "rel_l2 <= 0.01" in accuracy_note(record) and "error 0.002" in accuracy_note(record)
    assert read_accuracy(Fields({}, "", ManifestError)) is None
    for bad in (
        {"accuracy": "yes"},
        {"accuracy": {"budget": {"max_error": "0.01"}}},
        {"accuracy": {"budget": {}, "error": [1]}},
        {"accuracy": {"budget": {"metric": "x" * 201}}},
        {"accuracy": {"budget": {}, "changes_results": "no"}},
    ):
        with pytest.raises(ManifestError):
            read_accuracy(Fields(bad, "", ManifestError))
