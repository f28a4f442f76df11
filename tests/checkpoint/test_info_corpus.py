"""``tunetree info`` agrees with ``tt.load`` over the whole hostile-file corpus (issue 29).

Every hostile file the checkpoint tests build (:mod:`.hostile`: the OpenVINO fixture's
``SUITE``, the ONNX checkpoints' ``ONNX_SUITE``, the tuned ``generate``'s
``GENERATION_SUITE``) is loaded and shown by ``tunetree info``: wherever the load refuses it,
info exits non-zero. Before, info said "compatible" for 14 such attacks: weights safetensors
cannot parse, ONNX models ONNX Runtime refuses (a custom domain, external data named by a
sparse initializer or a sparse Constant), unhashable Autocast dtypes; and now also for
content that contradicts its kind and for cache classes outside the allow-list."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tunetree as tt
from tests.checkpoint.fixtures.make_fixtures import model
from tests.checkpoint.hostile import (
    GENERATION_SUITE,
    ONNX_SUITE,
    SUITE,
    as_recorded,
    rewrite,
)
from tunetree.cli import main as cli_main

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None or importlib.util.find_spec("onnx") is None,
    reason="the corpus holds OpenVINO and ONNX runners",
)

Built = tuple[Callable[[], Any], Path]
"""The model a file is loaded into, and the file."""


def _build(name: str, target: Path, request: pytest.FixtureRequest) -> Built:
    if name in SUITE:
        return model, SUITE[name](target)
    if name in ONNX_SUITE:
        which, build = ONNX_SUITE[name]
        source = request.getfixturevalue(f"{which}_checkpoint")
        return model, build(target, source)
    pytest.importorskip("transformers")
    from tests.checkpoint.fixtures.make_generation_fixture import FIXTURE, gpt2

    return gpt2, rewrite(target, manifest=GENERATION_SUITE[name], source=FIXTURE)


CORPUS = sorted([*SUITE, *ONNX_SUITE, *GENERATION_SUITE])


def _refusal(make_model: Callable[[], Any], path: Path) -> tt.TunetreeError | None:
    """Why ``tt.load`` refuses ``path`` (typed), or None when it loads (and serves a call of
    the MLP fixture's model)."""
    try:
        tuned = tt.load(make_model(), path)
    except tt.TunetreeError as exc:
        return exc
    if make_model is model:
        with torch.no_grad():
            tuned(torch.zeros(2, 8))
    return None


def _info(path: Path) -> tuple[int, dict[str, Any]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli_main(["info", "--json", str(path)])
    assert "Traceback" not in err.getvalue()
    return status, json.loads(out.getvalue())


@pytest.mark.parametrize("name", CORPUS)
def test_info_exits_non_zero_wherever_load_refuses(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    make_model, path = _build(name, tmp_path / "hostile.tt", request)
    as_recorded(path, monkeypatch)  # the environment matches: only the file's content counts
    refusal = _refusal(make_model, path)
    assert refusal is not None, f"{name}: every file of the corpus is hostile"
    status, document = _info(path)
    assert status != 0 and document["compatible"] is False, (name, str(refusal), document)


@pytest.mark.parametrize("which", ["onnx", "int8"])
def test_the_onnx_sources_load_and_info_agrees(
    which: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """The files the ONNX corpus is made from load, and info says so after opening a session
    on each ONNX model (what made it refuse a custom domain)."""
    path = rewrite(tmp_path / "a.tt", source=request.getfixturevalue(f"{which}_checkpoint"))
    as_recorded(path, monkeypatch)
    assert _refusal(model, path) is None
    status, document = _info(path)
    assert status == 0 and document["verified"]["runners"] == 1, document


def test_the_generation_source_loads_and_info_agrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    from tests.checkpoint.fixtures.make_generation_fixture import FIXTURE, gpt2

    path = rewrite(tmp_path / "a.tt", source=FIXTURE)
    as_recorded(path, monkeypatch)
    assert _refusal(gpt2, path) is None
    status, document = _info(path)
    assert status == 0 and document["verified"]["runners"] == 2, document
