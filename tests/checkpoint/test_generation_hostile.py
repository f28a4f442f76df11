"""Hostile generation checkpoints (issue 29): graph keys with cache objects as data, and output
structures holding a cache. Every file is the committed tuned ``generate`` of a tiny GPT-2
(:mod:`tests.checkpoint.fixtures.make_generation_fixture`) edited with checksums recomputed.
Nothing a file names is built or run, learning an output structure allocates nothing a file
sizes, and a structure that is not the module's own is refused."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tunetree as tt
from tests.checkpoint.hostile import as_recorded, rewrite

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
from tests.checkpoint.fixtures.make_generation_fixture import (  # noqa: E402
    FIXTURE,
    generate,
    gpt2,
    prompt,
)

REPO = Path(__file__).resolve().parents[2]
PREFILL, DECODE = 0, 1
"""The fixture's plan entries."""


def _edited(tmp_path: Path, edit: Callable[[dict[str, Any]], Any], name: str = "g.tt") -> Path:
    return rewrite(tmp_path / name, manifest=edit, source=FIXTURE)


def _layers(entry: dict[str, Any]) -> list[Any]:
    """The ``["data", "DynamicLayer", attributes]`` nodes of an entry's cache argument."""
    cache = entry["graph"]["args"][1]
    assert cache[0] == "data" and cache[1] == "DynamicCache"
    layers = dict(cache[2])["layers"]
    assert layers[0] == "list"
    return layers[1]  # type: ignore[no-any-return]


def test_the_fixture_loads_and_generates_eagers_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    as_recorded(FIXTURE, monkeypatch)
    loaded = tt.load(gpt2(), FIXTURE)
    p = prompt(2, 7, 9)
    assert torch.equal(generate(loaded, **p), generate(gpt2(), **p))


def _plant_quanto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``optimum.quanto`` package on ``sys.path`` (as a user might keep one beside the
    checkpoint) that leaves a marker when anything imports it."""
    marker = tmp_path / "quanto-ran"
    package = tmp_path / "planted" / "optimum" / "quanto"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (package / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "def quantize_weight(*a, **k):\n    raise SystemExit('planted')\n"
        "MaxOptimizer = qint2 = qint4 = object\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "planted"))
    return marker


def test_a_cache_class_named_by_the_file_is_never_built_or_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 2: the key's layers renamed ``QuantoQuantizedLayer``. Before, the key's cache was
    rebuilt with that class (looked up among loaded transformers classes), the module run on
    it, and GPT-2's forward called the layer's ``update``, which imported the planted
    ``optimum.quanto``."""
    marker = _plant_quanto(tmp_path, monkeypatch)

    def edit(m: dict[str, Any]) -> None:
        for layer in _layers(m["entries"][PREFILL]):
            layer[1] = "QuantoQuantizedLayer"
            # What QuantizedLayer.update reads before it quantizes the prefill's states, which
            # imports optimum.quanto.
            layer[2] += [
                ["axis_key", ["const", "int", 0]],
                ["axis_value", ["const", "int", 0]],
                ["cumulative_length", ["const", "int", 0]],
            ]
            layer[2].sort()

    path = _edited(tmp_path, edit)
    as_recorded(path, monkeypatch)
    try:
        with pytest.raises(tt.TunetreeError, match="QuantoQuantizedLayer"):
            tt.load(gpt2(), path)
        assert not marker.exists()
        assert "optimum" not in sys.modules and "optimum.quanto" not in sys.modules
    finally:
        for name in ("optimum.quanto", "optimum"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize(
    "attribute",
    [["__class__", ["const", "NoneType", None]], ["0bad", ["const", "NoneType", None]]],
)
def test_cache_attributes_of_bad_names_are_refused(
    attribute: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def edit(m: dict[str, Any]) -> None:
        _layers(m["entries"][DECODE])[0][2].append(attribute)

    path = _edited(tmp_path, edit)
    as_recorded(path, monkeypatch)
    with pytest.raises(tt.TunetreeError, match="cache attribute"):
        tt.load(gpt2(), path)


def test_a_plain_output_structure_where_the_module_returns_a_model_output_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 4: the decode step's output structure replaced by a plain tuple of as many
    leaves. Before, it was never compared with the module's output: the file loaded and
    ``generate`` raised an untyped AttributeError inside transformers."""

    def edit(m: dict[str, Any]) -> None:
        outputs = m["entries"][DECODE]["runner"]["outputs"]
        outputs["structure"] = ["tuple", [["leaf"]] * outputs["num_leaves"]]

    path = _edited(tmp_path, edit)
    as_recorded(path, monkeypatch)
    with pytest.raises(tt.BackendError, match="output structure differs"):
        tt.load(gpt2(), path)


# --- memory: nothing a file sizes is allocated to learn a structure -------------------------


def _peak_in_child(path: Path) -> tuple[str, int]:
    """Load ``path`` in a child process: its outcome and how many MiB its peak memory grew."""
    script = textwrap.dedent(
        f"""
        import json, resource
        import tunetree as tt
        from tests.checkpoint.hostile import parts
        from tests.checkpoint.fixtures.make_generation_fixture import gpt2
        from tunetree.checkpoint import loading
        rec = parts(__import__("pathlib").Path({str(path)!r}))[0]
        loading.environment_record = lambda kinds: rec
        m = gpt2()
        limit = 6 << 30  # address space: a load that regresses fails here, not the machine
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            tt.load(m, {str(path)!r})
            outcome = "ok"
        except tt.TunetreeError as exc:
            outcome = "typed: " + type(exc).__name__ + ": " + str(exc)[:300]
        except BaseException as exc:
            outcome = "untyped: " + type(exc).__name__ + ": " + str(exc)[:300]
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
        print(json.dumps([outcome, grown]))
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(REPO)]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    outcome, grown = json.loads(done.stdout.strip().splitlines()[-1])
    return outcome, grown


def _fixed_batch(size: int) -> Callable[[dict[str, Any]], None]:
    """Every batch axis of the prefill entry fixed at ``size``."""

    def fix(node: Any) -> Any:
        if isinstance(node, dict) and isinstance(node.get("shape"), list):
            shape = node["shape"]
            if shape and isinstance(shape[0], dict) and shape[0].get("dim") == "batch":
                shape[0] = size
        elif isinstance(node, dict | list):
            for item in node.values() if isinstance(node, dict) else node:
                fix(item)
        return node

    def edit(m: dict[str, Any]) -> None:
        fix(m["entries"][PREFILL]["graph"])

    return edit


@pytest.mark.parametrize(
    ("batch", "refusal"),
    [(1 << 23, "placeholder"), (1 << 21, "MiB, over the")],
    ids=["2^23: placeholders over the file's bound", "2^21: eager's peak over it"],
)
def test_a_batch_fixed_huge_in_a_named_structure_allocates_nothing(
    batch: int, refusal: str, tmp_path: Path
) -> None:
    """Finding 3: the prefill's batch fixed at 2^23 (its output structure is named, so the old
    placeholder bound was skipped): the module ran on zeros of that batch, gigabytes from an
    87 KB file. At 2^21 the placeholders fit the bound, and eager's peak on them, known from
    a run on fake tensors, does not fit what the load may spend."""
    path = _edited(tmp_path, _fixed_batch(batch))
    outcome, grown = _peak_in_child(path)
    assert outcome.startswith("typed:") and refusal in outcome, outcome
    assert grown < 300, f"peak memory grew {grown} MiB ({outcome})"


def test_a_static_layer_sized_by_the_file_allocates_nothing(tmp_path: Path) -> None:
    """Finding 3: the prefill's cache layer made a ``StaticLayer`` whose ``max_cache_len``
    comes from the file: its lazy initialisation allocated 1.1 GB."""

    def edit(m: dict[str, Any]) -> None:
        for layer in _layers(m["entries"][PREFILL]):
            layer[1] = "StaticLayer"
            layer[2] += [
                ["max_cache_len", ["const", "int", 1 << 22]],
                ["cumulative_length", {"dtype": "i64", "shape": []}],
            ]
            layer[2].sort()

    path = _edited(tmp_path, edit)
    outcome, grown = _peak_in_child(path)
    assert outcome.startswith("typed:") and "4194304" in outcome, outcome
    assert grown < 300, f"peak memory grew {grown} MiB ({outcome})"


def test_a_static_layer_of_a_plausible_size_is_built_from_the_allow_list() -> None:
    """The allow-list admits transformers' inert layers, with sizes the model accounts for."""
    from tunetree.signature.graph import GraphKey
    from tunetree.signature.synthetic import call_from_key, size_limit

    layer = ["data", "StaticLayer", [["is_initialized", ["const", "bool", False]],
             ["max_cache_len", ["const", "int", 16]]]]  # fmt: skip
    key = GraphKey.from_json({"args": [{"dtype": "f32", "shape": [2, 4]}, layer], "kwargs": []})
    model = gpt2()
    call = call_from_key(key, torch.device("cpu"), limit=size_limit(key, model))
    assert type(call.args[1]) is transformers.cache_utils.StaticLayer
    assert call.args[1].max_cache_len == 16  # within the config's n_positions (32)
    too_long = json.loads(json.dumps(key.to_json()).replace("16]", "33]"))
    with pytest.raises(tt.BackendError, match="states the size 33"):
        call_from_key(GraphKey.from_json(too_long), torch.device("cpu"), limit=32)


def test_classes_outside_the_allow_list_are_never_found() -> None:
    from tunetree.hf import INERT_CACHE_CLASSES, inert_cache_class

    assert inert_cache_class("DynamicLayer") is transformers.cache_utils.DynamicLayer
    for name in ("QuantoQuantizedLayer", "HQQQuantizedLayer", "QuantizedCache", "os", "Cache"):
        assert name not in INERT_CACHE_CLASSES and inert_cache_class(name) is None
    assert inert_cache_class(["DynamicLayer"]) is None
    assert importlib.util.find_spec("tunetree.hf.caches") is not None


def test_info_refuses_a_negative_cache_size_as_load_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache layer of the prefill's key sized -7: ``tt.load`` refused it while ``tunetree
    info`` said the file loads here (exit 0). Both refuse it now, with the same reason."""
    from tunetree.cli import EXIT_UNREADABLE, main

    def edit(m: dict[str, Any]) -> None:
        for layer in _layers(m["entries"][PREFILL]):
            layer[1] = "StaticLayer"
            layer[2] += [
                ["max_cache_len", ["const", "int", -7]],
                ["cumulative_length", {"dtype": "i64", "shape": []}],
            ]
            layer[2].sort()

    path = _edited(tmp_path, edit)
    as_recorded(path, monkeypatch)
    assert main(["info", str(path)]) == EXIT_UNREADABLE
    assert "states the size -7" in capsys.readouterr().err
    with pytest.raises(tt.TunetreeError, match="states the size -7"):
        tt.load(gpt2(), path)
