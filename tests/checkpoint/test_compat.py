"""Files written by the first release (format version 1, cache schema 1) still load.

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


@needs_openvino
def test_v1_cache_entry_is_a_hit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "cache"
    shutil.copytree(HERE / "v1_cache", directory)
    (entry,) = (directory / "entries").iterdir()
    body = json.loads((entry / "manifest.json").read_bytes().partition(b"\n")[2])
    recorded = keys.Environment(body["environment"]["hard"], body["environment"]["soft"])
    monkeypatch.setattr(keys, "environment", lambda device, kinds: recorded)
    cache = tt.TuningCache(directory)

    def no_build(*args: Any) -> Any:
        raise AssertionError("a cache hit must not build the backend")

    monkeypatch.setattr(tt.backends.OpenVINO, "build", no_build)
    result = tt.tune(
        model(),
        inputs(),
        strategy=tt.OneBackendStrategy(tt.backends.OpenVINO()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=cache,
    )
    assert cache.stats.hits == 1 and cache.stats.misses == 0 and cache.stats.invalid == 0
    assert result.graphs[0].winner is not None
    assert result.graphs[0].winner.backend.kind == "openvino"
    _assert_expected("v1_cache", _outputs(result.model), atol=1e-5)


def test_a_checkpoint_names_no_tunetree_module(tmp_path: Path) -> None:
    """Moving a module (issue 27) cannot break a checkpoint: none is named in one.

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
