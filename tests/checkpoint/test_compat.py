"""Files written by the first release: checkpoints (format version 1) still load; cache
entries (schema 1) are a clean miss, never misread.

The fixtures were written by ``tests/checkpoint/fixtures/make_fixtures.py`` with the code
before persistence became two subpackages. Their environment record names the machine that
wrote them, so each test makes the running environment read as the recorded one: what is
checked here is the file format, not the environment policy (tested elsewhere).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import tunetree as tt
from tests.checkpoint.fixtures.make_fixtures import HERE, inputs, model
from tunetree.cache import keys
from tunetree.checkpoint import loading, read_info
from tunetree.checkpoint.reader import read_header
from tunetree.runtime.wrap import wrapped_paths

EXPECTED: dict[str, Any] = json.loads((HERE / "v1_expected.json").read_text())
needs_openvino = pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None, reason="openvino is not installed"
)


def _outputs(tuned: Any) -> list[torch.Tensor]:
    with torch.no_grad():
        return [tuned(x) for x in inputs()]


def _assert_expected(name: str, got: list[torch.Tensor], atol: float) -> None:
    want = [torch.tensor(v) for v in EXPECTED[name]]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=atol, rtol=0.0)


def _load_as_recorded(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    path = HERE / name
    recorded = read_header(path).record
    monkeypatch.setattr(loading, "environment_record", lambda kinds: recorded)
    return tt.load(model(), path)


def test_inputs_are_the_recorded_ones() -> None:
    assert [x.tolist() for x in inputs()] == EXPECTED["inputs"]


def test_v1_eager_checkpoint_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    tuned = _load_as_recorded("v1_eager.tt", monkeypatch)
    _assert_expected("v1_eager.tt", _outputs(tuned), atol=1e-6)


@needs_openvino
def test_v1_openvino_checkpoint_loads_its_runners(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = read_info(HERE / "v1_openvino.tt").manifest.entries
    assert entries and {e.backend.kind for e in entries} == {"openvino"}
    assert all(e.members for e in entries)  # artifacts to extract, not eager fallbacks
    tuned = _load_as_recorded("v1_openvino.tt", monkeypatch)
    assert wrapped_paths(tuned)
    _assert_expected("v1_openvino.tt", _outputs(tuned), atol=1e-5)


def _v1_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The first release's cache (schema 1) in a temporary directory, its environment current."""
    directory = tmp_path / "cache"
    shutil.copytree(HERE / "v1_cache", directory)
    (entry,) = (directory / "entries").iterdir()
    body = json.loads((entry / "manifest.json").read_bytes().partition(b"\n")[2])
    assert body["schema"] == 1
    recorded = keys.Environment(body["environment"]["hard"], body["environment"]["soft"])
    monkeypatch.setattr(keys, "environment", lambda device, kinds: recorded)
    return directory, entry


def _tune_counting_builds(cache: tt.TuningCache, monkeypatch: pytest.MonkeyPatch) -> Any:
    built: list[int] = []
    build = tt.backends.OpenVINO.build

    def counted(self: Any, *args: Any) -> Any:
        built.append(1)
        return build(self, *args)

    monkeypatch.setattr(tt.backends.OpenVINO, "build", counted)
    result = tt.tune(
        model(),
        inputs(),
        strategy=tt.OneBackendStrategy(tt.backends.OpenVINO()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=cache,
    )
    monkeypatch.setattr(tt.backends.OpenVINO, "build", build)
    assert result.graphs[0].winner is not None
    assert result.graphs[0].winner.backend.kind == "openvino"
    _assert_expected("v1_cache", _outputs(result.model), atol=1e-5)
    return result, len(built)


@needs_openvino
def test_a_v1_cache_entry_is_a_clean_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cache schema 2 keys name no tunetree module: the first release's entry is not found."""
    directory, old = _v1_cache(tmp_path, monkeypatch)
    cache = tt.TuningCache(directory)
    _, builds = _tune_counting_builds(cache, monkeypatch)
    assert builds == 1
    assert cache.stats.hits == 0 and cache.stats.misses == 1 and cache.stats.invalid == 0
    new = [e for e in (directory / "entries").iterdir() if e != old]
    assert len(new) == 1 and old.exists()  # tuned afresh beside it; the old one left alone


@needs_openvino
def test_a_v1_entry_met_under_a_current_key_is_refused_not_misread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Even where a schema-1 manifest sits at a schema-2 key, it is refused by its schema."""
    directory, old = _v1_cache(tmp_path, monkeypatch)
    _tune_counting_builds(tt.TuningCache(directory), monkeypatch)
    (current,) = [e for e in (directory / "entries").iterdir() if e != old]
    for name in ("manifest.json", "placed.txt"):
        (current / name).write_bytes((old / name).read_bytes())
    cache = tt.TuningCache(directory)
    with caplog.at_level("INFO", logger="tunetree"):
        _, builds = _tune_counting_builds(cache, monkeypatch)
    assert builds == 1 and cache.stats.hits == 0 and cache.stats.invalid == 1
    assert "schema 1" in caplog.text


def test_a_checkpoint_names_no_tunetree_module(tmp_path: Path) -> None:
    """Moving a module cannot break a checkpoint: none is named in one.

    Every member of the archive is read, the manifest included; backends are recorded by kind.
    """
    import re
    import zipfile

    result = tt.tune(
        model(),
        inputs(),
        strategy=tt.OneBackendStrategy(tt.backends.Eager()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    path = tmp_path / "model.tt"
    tt.save(result, path)
    data = path.read_bytes()
    start = data.index(b"PK\x03\x04")
    with zipfile.ZipFile(path) as archive:
        texts = [data[:start], *(archive.read(n) for n in archive.namelist())]
    for text in texts:
        assert not re.findall(rb"tunetree\.[A-Za-z_]", text)
