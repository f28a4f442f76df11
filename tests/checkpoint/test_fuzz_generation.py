"""Property-based fuzzing of generation graph keys and accuracy records (issue 29).

Graph keys hold cache objects as data (class names, attributes, sizes) and a plan may carry an
accuracy record; both come from a file. Mutated at random, with checksums recomputed:

* a key makes a call, or is refused with a ``BackendError``; every cache object of a call is
  an instance of an allow-listed transformers class, no attribute is a dunder, no size it
  states is over the bound; what ``tunetree info`` refuses by name, the load refuses too;
* the tuned ``generate`` fixture, its keys mutated, loads and generates eager's tokens, or
  is refused with a ``TunetreeError``, and ``tunetree info`` never crashes;
* a results-changing plan with a mutated accuracy record loads (labelled as changing
  results, whatever the record claims) or is refused typed.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import tunetree as tt  # noqa: E402
from tests.checkpoint.fixtures.make_fixtures import model  # noqa: E402
from tests.checkpoint.fixtures.make_generation_fixture import (  # noqa: E402
    FIXTURE,
    generate,
    gpt2,
    prompt,
)
from tests.checkpoint.hostile import autocast_file, parts, rewrite  # noqa: E402
from tunetree.checkpoint import info, loading  # noqa: E402
from tunetree.cli import main as cli_main  # noqa: E402
from tunetree.errors import BackendError  # noqa: E402
from tunetree.hf import INERT_CACHE_CLASSES  # noqa: E402
from tunetree.signature.graph import GraphKey  # noqa: E402
from tunetree.signature.synthetic import call_from_key, check_key_names  # noqa: E402

pytestmark = pytest.mark.timeout(600)
FUZZ = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

OUTSIDE = ["QuantoQuantizedLayer", "HQQQuantizedLayer", "QuantizedCache", "Cache", "Popen", "os"]
CLASS_NAMES = st.sampled_from([*sorted(INERT_CACHE_CLASSES), *OUTSIDE]) | st.text(max_size=12)
ATTRIBUTE_NAMES = st.sampled_from(
    ["keys", "values", "is_initialized", "max_cache_len", "sliding_window", "layers",
     "cumulative_length", "_sliding_window_tensor", "__class__", "__dict__", "0x", ""]
) | st.text(max_size=8)  # fmt: skip
SIZES = st.integers(-2, 40) | st.sampled_from([1 << 20, 1 << 40, 2**31 - 1])
TENSOR = st.builds(
    lambda dtype, shape: {"dtype": dtype, "shape": shape},
    st.sampled_from(["f32", "i64", "bool", "bf16", "c64", "x"]),
    st.lists(st.integers(0, 6), max_size=4),
)
CONSTANT = st.one_of(
    st.builds(lambda v: ["const", "int", v], SIZES),
    st.builds(lambda v: ["const", "bool", v], st.booleans()),
    st.builds(lambda v: ["const", "float", v], st.floats(allow_nan=True)),
    st.builds(lambda v: ["const", "NoneType", v], st.none() | st.integers(0, 3)),
    st.builds(lambda v: ["const", "str", v], st.text(max_size=8)),
    st.builds(lambda v: ["const", "device", v], st.sampled_from(["cpu", "cuda:x", "meta", ""])),
    st.builds(
        lambda v: ["const", "type", v],
        st.sampled_from(
            ["transformers.cache_utils.DynamicLayer", "os.system", "builtins.eval", "x"]
        ),
    ),
    st.builds(lambda v: ["object", "Thing", v], st.integers(0, 9)),
)


def _data_nodes(depth: int) -> Any:
    leaf = TENSOR | CONSTANT
    if depth == 0:
        return leaf
    inner = _data_nodes(depth - 1)
    return leaf | st.builds(
        lambda name, attributes: ["data", name, attributes],
        CLASS_NAMES,
        st.lists(st.lists(ATTRIBUTE_NAMES, min_size=1, max_size=1).flatmap(
            lambda n: st.tuples(st.just(n[0]), inner).map(list)
        ), max_size=4),
    ) | st.builds(lambda items: ["list", items], st.lists(inner, max_size=3))  # fmt: skip


@FUZZ
@given(node=_data_nodes(2))
def test_keys_make_calls_of_allow_listed_classes_or_are_refused(node: Any) -> None:
    try:
        key = GraphKey.from_json({"args": [{"dtype": "f32", "shape": [2, 4]}, node], "kwargs": []})
    except (ValueError, TypeError):
        return  # refused by the manifest reader before anything else
    refused_by_name = False
    try:
        check_key_names(key)
    except BackendError:
        refused_by_name = True
    try:
        call = call_from_key(key, torch.device("cpu"), limit=32)
    except BackendError:
        return
    assert not refused_by_name, "info would refuse what the load builds"
    for obj in _objects(call.args[1]):
        cls = type(obj)
        assert cls.__module__ == "transformers.cache_utils" and cls.__name__ in INERT_CACHE_CLASSES
        for name, value in vars(obj).items():
            assert not name.startswith("__")
            if type(value) is int:
                assert -1 <= value <= 32


def _objects(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [o for v in value for o in _objects(v)]
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, type):
        return []
    if hasattr(value, "__dict__") and type(value).__module__.startswith("transformers"):
        return [value, *(o for v in vars(value).values() for o in _objects(v))]
    return []


EXPECTED = None


def _expected() -> torch.Tensor:
    global EXPECTED
    if EXPECTED is None:
        EXPECTED = generate(gpt2(), **prompt(2, 7, 9))
    return EXPECTED


def _check_generation(path: Path) -> None:
    recorded = parts(path)[0]
    with (
        pytest.MonkeyPatch.context() as patch,
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        patch.setattr(loading, "environment_record", lambda kinds: recorded)
        patch.setattr(info, "environment_record", lambda kinds: recorded)
        try:
            loaded = tt.load(gpt2(), path)
        except tt.TunetreeError:
            pass
        else:
            try:
                tokens = generate(loaded, **prompt(2, 7, 9))
            except tt.TunetreeError:
                pass
            else:
                assert torch.equal(tokens, _expected())
        assert cli_main(["info", str(path)]) in (0, 1, 2)


def _places(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _places(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _places(value, (*prefix, index))
    return found


@settings(FUZZ, max_examples=20)
@given(data=st.data())
def test_mutated_generation_keys_load_and_generate_eagers_tokens_or_are_refused(data: Any) -> None:
    def edit(m: dict[str, Any]) -> None:
        entry = m["entries"][data.draw(st.sampled_from([0, 1]))]
        cache = entry["graph"]["args"][1]
        places = [p for p in _places(cache) if p]
        place = data.draw(st.sampled_from(places))
        parent = cache
        for step in place[:-1]:
            parent = parent[step]
        parent[place[-1]] = data.draw(_data_nodes(1) | CLASS_NAMES | ATTRIBUTE_NAMES | SIZES)

    with tempfile.TemporaryDirectory() as tmp:
        _check_generation(rewrite(Path(tmp) / "g.tt", manifest=edit, source=FIXTURE))


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
RECORD = (
    st.fixed_dictionaries(
        {
            "budget": st.fixed_dictionaries(
                {},
                optional={
                    "metric": st.sampled_from(["rel_l2", "max_abs", "cosine", "top1", ""]) | JSON,
                    "max_error": st.floats(allow_nan=True) | JSON,
                    "module_max_error": st.floats(0, 1) | st.floats(allow_nan=True) | JSON,
                    "max_drop": JSON,
                    "evaluate": JSON,
                    "holdout": JSON,
                },
            )
            | JSON,
        },
        optional={
            "error": st.floats(allow_nan=True) | JSON,
            "heldout_error": JSON,
            "score_drop": JSON,
            "changes_results": st.booleans() | JSON,
        },
    )
    | JSON
)


@settings(FUZZ, max_examples=30)
@given(record=RECORD)
def test_accuracy_records_never_hide_that_a_plan_changes_results(record: Any) -> None:
    """A bf16 Autocast plan with any accuracy record: refused typed, or loaded and labelled
    as changing results (from its content), whatever the record says."""
    with tempfile.TemporaryDirectory() as tmp:
        path = autocast_file(["f32"])(Path(tmp) / "a.tt")
        path = rewrite(
            Path(tmp) / "b.tt", manifest=lambda m: m.update(accuracy=record), source=path
        )
        recorded = parts(path)[0]
        logger = logging.getLogger("tunetree")
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        logger.addHandler(handler)
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(loading, "environment_record", lambda kinds: recorded)
                patch.setattr(info, "environment_record", lambda kinds: recorded)
                try:
                    tuned = tt.load(model(), path)
                except tt.TunetreeError:
                    pass
                else:
                    assert "the plan changes results" in stream.getvalue()
                    with torch.no_grad():
                        assert tuned(torch.zeros(2, 8)).shape == (2, 4)
                with contextlib.redirect_stdout(io.StringIO()):
                    assert cli_main(["info", str(path)]) in (0, 1, 2)
        finally:
            logger.removeHandler(handler)
