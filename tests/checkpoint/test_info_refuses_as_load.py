"""``tunetree info`` refuses what ``tt.load`` refuses, for records it can check without the model.

Two records ``info`` called compatible though ``tt.load`` refused them (exit 0 in info): an
Autocast record whose ``output_dtypes`` list has another length than the runner's outputs,
and a cache layer of a generation key stating a negative size (-1). Each file is a real
checkpoint written by ``tt.save``, edited with its checksums recomputed (:mod:`.hostile`).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tunetree as tt
from tests.checkpoint.fixtures.make_fixtures import inputs, model
from tests.checkpoint.hostile import as_recorded, rewrite
from tunetree.cli import EXIT_OK, EXIT_UNREADABLE
from tunetree.cli import main as cli_main


def _info(path: Path) -> tuple[int, str, dict[str, Any]]:
    """Exit status, stderr and JSON document of ``tunetree info --json``."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli_main(["info", "--json", str(path)])
    return status, err.getvalue(), json.loads(out.getvalue())


@pytest.fixture(scope="module")
def autocast_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's model tuned whole with bf16 Autocast and saved by ``tt.save``."""
    result = tt.tune(
        model(),
        inputs(),
        strategy=tt.OneBackendStrategy(tt.backends.Autocast()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    assert [e.backend.kind for e in result.plan.entries] == ["autocast"], result.table()
    path = tmp_path_factory.mktemp("autocast") / "autocast.tt"
    tt.save(result, path)
    return path


def _autocast_runner(edit: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def manifest(m: dict[str, Any]) -> None:
        (entry,) = m["entries"]
        assert entry["backend"]["kind"] == "autocast"
        edit(entry["runner"])

    return manifest


def test_a_saved_autocast_record_holds_its_output_structure_and_loads(
    autocast_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The untouched file: its record names the outputs' structure (one tensor), info says it
    loads here, and it does."""
    recorded: list[dict[str, Any]] = []
    path = rewrite(
        autocast_checkpoint.with_name("same.tt"),
        manifest=_autocast_runner(recorded.append),
        source=autocast_checkpoint,
    )
    assert recorded == [{"output_dtypes": ["f32"], "structure": ["leaf"]}]
    as_recorded(path, monkeypatch)
    status, err, document = _info(path)
    assert status == EXIT_OK and document["compatible"] is True, (err, document)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli_main(["info", str(path)])
    assert "Autocast runner saved without its output structure" not in out.getvalue()
    loaded = tt.load(model(), path)
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model()(x), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("dtypes", [["f32", "f32"], []], ids=["one too many", "none"])
def test_info_refuses_autocast_dtypes_that_do_not_fit_the_outputs(
    dtypes: list[Any], autocast_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Output dtypes of another count than the model's one output. Before, ``tt.load``
    refused the file and ``tunetree info`` exited 0 ("compatible"); both refuse it now, for
    the same reason, read from the record's own output structure."""
    path = rewrite(
        autocast_checkpoint.with_name("dtypes.tt"),
        manifest=_autocast_runner(lambda r: r.update(output_dtypes=dtypes)),
        source=autocast_checkpoint,
    )
    as_recorded(path, monkeypatch)
    reason = f"lists {len(dtypes)} output dtypes, but its output structure has 1"
    status, err, document = _info(path)
    assert status == EXIT_UNREADABLE and document["compatible"] is False, (err, document)
    assert reason in document["error"]
    with pytest.raises(tt.BackendError, match=reason):
        tt.load(model(), path)


def test_an_autocast_structure_that_is_not_the_models_is_refused_at_load(
    autocast_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Structure and dtypes edited to agree (a tuple of two tensors): the record is
    consistent, so info cannot tell without the model; ``tt.load`` learns the module's
    outputs and refuses it."""

    def edit(runner: dict[str, Any]) -> None:
        runner.update(output_dtypes=["f32", "f32"], structure=["tuple", [["leaf"], ["leaf"]]])

    path = rewrite(
        autocast_checkpoint.with_name("pair.tt"),
        manifest=_autocast_runner(edit),
        source=autocast_checkpoint,
    )
    as_recorded(path, monkeypatch)
    with pytest.raises(tt.BackendError, match="output structure differs"):
        tt.load(model(), path)


@pytest.mark.parametrize(
    ("structure", "reason"),
    [
        ("leaf", "holds something other than a node"),
        (["named", "tt_hostile_absent.Out", [["leaf"]]], "not installed here"),
    ],
    ids=["not a node", "type of an absent module"],
)
def test_a_malformed_autocast_structure_is_refused_typed_by_info_and_load(
    structure: Any, reason: str, autocast_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rewrite(
        autocast_checkpoint.with_name("bad.tt"),
        manifest=_autocast_runner(lambda r: r.update(structure=structure)),
        source=autocast_checkpoint,
    )
    as_recorded(path, monkeypatch)
    status, _, document = _info(path)
    assert status == EXIT_UNREADABLE and reason in document["error"], document
    with pytest.raises(tt.BackendError, match=reason):
        tt.load(model(), path)


def test_an_autocast_record_saved_without_its_structure_still_loads(
    autocast_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record of an earlier release (output dtypes only): it loads, its count checked
    against the module as before, and info says that count is left to ``tt.load``."""
    path = rewrite(
        autocast_checkpoint.with_name("earlier.tt"),
        manifest=_autocast_runner(lambda r: r.pop("structure")),
        source=autocast_checkpoint,
    )
    as_recorded(path, monkeypatch)
    status, _, document = _info(path)
    assert status == EXIT_OK, document
    tt.load(model(), path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli_main(["info", str(path)])
    assert "output count of 1 Autocast runner" in out.getvalue()


# --- negative sizes in a generation key --------------------------------------------------------

PREFILL, DECODE = 0, 1
"""The generation fixture's plan entries."""


def _layers(m: dict[str, Any], entry: int) -> list[Any]:
    cache = m["entries"][entry]["graph"]["args"][1]
    return dict(cache[2])["layers"][1]  # type: ignore[no-any-return]


def _static_capacity(size: int) -> Callable[[dict[str, Any]], None]:
    """The prefill's layers made ``StaticLayer`` of capacity ``size``."""

    def edit(m: dict[str, Any]) -> None:
        for layer in _layers(m, PREFILL):
            layer[1] = "StaticLayer"
            layer[2] += [
                ["max_cache_len", ["const", "int", size]],
                ["cumulative_length", {"dtype": "i64", "shape": []}],
            ]
            layer[2].sort()

    return edit


def _position(size: int) -> Callable[[dict[str, Any]], None]:
    """The decode step's layers stating ``size`` positions written."""

    def edit(m: dict[str, Any]) -> None:
        for layer in _layers(m, DECODE):
            layer[2].append(["cumulative_length", ["const", "int", size]])
            layer[2].sort()

    return edit


@pytest.mark.parametrize(
    "edit", [_static_capacity(-1), _position(-1)], ids=["static capacity -1", "position -1"]
)
def test_info_refuses_a_cache_size_of_minus_one_as_load_does(
    edit: Callable[[dict[str, Any]], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A size of -1 in a cache layer of the tuned ``generate``'s keys. Before, ``tt.load``
    refused it only when the module ran on it ("negative dimension -1") while ``tunetree
    info`` exited 0; no cache layer holds a negative size or position, and both refuse it
    now, before anything runs."""
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    from tests.checkpoint.fixtures.make_generation_fixture import FIXTURE, gpt2

    path = rewrite(tmp_path / "g.tt", manifest=edit, source=FIXTURE)
    as_recorded(path, monkeypatch)
    status, err, document = _info(path)
    assert status == EXIT_UNREADABLE and document["compatible"] is False, (err, document)
    assert "states the size -1" in document["error"]
    with pytest.raises(tt.BackendError, match="states the size -1"):
        tt.load(gpt2(), path)


def test_info_refuses_a_static_layer_of_capacity_zero_as_load_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A static cache layer with room for no position. Before, ``tunetree info`` exited 0 and
    ``tt.load`` refused it only after running the module on it (its outputs then differed
    from the saved runner's); no static layer is made so, and both refuse it by name now."""
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    from tests.checkpoint.fixtures.make_generation_fixture import FIXTURE, gpt2

    path = rewrite(tmp_path / "g.tt", manifest=_static_capacity(0), source=FIXTURE)
    as_recorded(path, monkeypatch)
    status, err, document = _info(path)
    reason = "StaticLayer states max_cache_len 0"
    assert status == EXIT_UNREADABLE and document["compatible"] is False, (err, document)
    assert reason in document["error"]
    with pytest.raises(tt.BackendError, match=reason):
        tt.load(gpt2(), path)
