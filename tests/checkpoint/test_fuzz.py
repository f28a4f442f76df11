"""Property-based fuzzing of checkpoint reading (issues 13 and 19): a valid ``.tt`` file
mutated at random, as raw bytes and as manifest JSON with checksums recomputed. ``tt.load``,
every call of the loaded model (the tuned shape and shapes it was not tuned for) and
``tunetree info`` either succeed (calls with outputs equal to the original's) or raise a
``tt.TunetreeError``: never another exception, a hang (pytest-timeout) or a crash."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import struct
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
# The fixture it mutates holds an OpenVINO runner (a machine without it skips, not errors).
pytest.importorskip("openvino")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import tunetree as tt  # noqa: E402
from tests.checkpoint.fixtures.make_fixtures import inputs, model  # noqa: E402
from tests.checkpoint.hostile import SOURCE, rewrite  # noqa: E402
from tunetree.checkpoint import info, loading  # noqa: E402
from tunetree.cli import main as cli_main  # noqa: E402

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="needs openvino"),
    pytest.mark.timeout(300),
]
FUZZ = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([10**400, -1, 2**31, 65536])
    | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _record(path: Path) -> Any:
    data = path.read_bytes()
    try:
        length = struct.unpack("<II", data[:8])[1]
        return json.loads(data[8 : 8 + length])
    except (struct.error, ValueError, RecursionError):
        return {}


CALLS = [*inputs(), torch.ones(1, 8), torch.ones(3, 8)]
"""The tuned shape, and two the runners were not tuned for (the original forward's)."""


def _outputs(tuned: Any) -> list[torch.Tensor]:
    with torch.no_grad():
        return [tuned(x) for x in CALLS]


with mock.patch.object(loading, "environment_record", lambda kinds: _record(SOURCE)):
    EXPECTED = _outputs(tt.load(model(), SOURCE))


def _check(path: Path) -> None:
    """The property: typed refusal or the original's outputs, for load, calls and info."""
    recorded = _record(path)
    with (
        mock.patch.object(loading, "environment_record", lambda kinds: recorded),
        mock.patch.object(info, "environment_record", lambda kinds: recorded),
    ):
        try:
            tuned = tt.load(model(), path)
            outputs = _outputs(tuned)
        except tt.TunetreeError:
            pass
        else:
            for got, want in zip(outputs, EXPECTED, strict=True):
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert cli_main(["info", str(path)]) in (0, 1, 2)


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)),
        min_size=1,
        max_size=8,
    ),
    cut=st.none() | st.integers(min_value=0),
)
def test_byte_mutations_are_refused_typed(edits: list[tuple[int, int]], cut: int | None) -> None:
    data = bytearray(SOURCE.read_bytes())
    for at, value in edits:
        data[at % len(data)] = value
    if cut is not None:
        data = data[: cut % len(data)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.tt"
        path.write_bytes(bytes(data))
        _check(path)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document, as a path of keys and indices."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


@FUZZ
@given(data=st.data())
def test_manifest_and_record_mutations_with_valid_checksums(data: Any) -> None:
    """The manifest or the environment record edited at a random place, members and record
    binding recomputed: the attack reaches validation and the backends."""

    def edit(document: dict[str, Any]) -> None:
        places = [p for p in _paths(document) if p]
        # Most of the attack surface is in the first plan entry (backend, runner, graph).
        entry = [p for p in places if p[:2] == ("entries", 0)] or places
        place = data.draw(st.sampled_from(entry) | st.sampled_from(places))
        parent = document
        for step in place[:-1]:
            parent = parent[step]
        parent[place[-1]] = data.draw(JSON)

    which = data.draw(st.sampled_from(["manifest", "record"]))
    with tempfile.TemporaryDirectory() as tmp:
        path = rewrite(Path(tmp) / "m.tt", **{which: edit})
        _check(path)


PATH_ENTRY = st.lists(
    st.sampled_from(["i", "k", "a"])
    .flatmap(
        lambda kind: st.tuples(
            st.just(kind), st.integers(0, 6) | st.sampled_from(["x", "T", "count", "shape"])
        )
    )
    .map(list),
    min_size=1,
    max_size=4,
)
"""A saved input path: steps into ``(args, kwargs)``, plausible enough to pass the format."""


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_runner_record_and_graph_mutations_fail_at_load_or_serve_correctly(data: Any) -> None:
    """Issue 19: the first entry's runner record and graph edited (input paths, shapes, dtypes,
    ranges): any refusal is typed and at load, and a file that loads serves every call right,
    the ones it cannot serve through the original forward."""

    def edit(document: dict[str, Any]) -> None:
        entry = document["entries"][0]
        what = data.draw(st.sampled_from(["paths", "shapes", "dtypes", "graph", "anywhere"]))
        if what == "paths":
            entry["runner"]["inputs"]["paths"] = data.draw(st.lists(PATH_ENTRY, max_size=3))
        elif what == "shapes":
            side = data.draw(st.sampled_from(["inputs", "outputs"]))
            entry["runner"][side]["shapes"] = data.draw(
                st.lists(st.lists(st.integers(0, 1 << 16), max_size=3), max_size=2)
            )
        elif what == "dtypes":
            side = data.draw(st.sampled_from(["inputs", "outputs"]))
            names = st.sampled_from(["float32", "float64", "int64", "bool", "bfloat16"])
            entry["runner"][side]["dtypes"] = data.draw(st.lists(names, max_size=2))
        elif what == "graph":
            low = data.draw(st.integers(1, 10))
            size = data.draw(
                st.integers(1, 10)
                | st.builds(lambda h: {"dim": "b", "min": low, "max": h}, st.integers(low, 10**6))
            )
            entry["graph"]["args"][0]["shape"][0] = size
        else:
            places = [p for p in _paths(entry["runner"]) if p]
            place = data.draw(st.sampled_from(places))
            parent = entry["runner"]
            for step in place[:-1]:
                parent = parent[step]
            parent[place[-1]] = data.draw(JSON)

    with tempfile.TemporaryDirectory() as tmp:
        path = rewrite(Path(tmp) / "m.tt", manifest=edit)
        _check(path)
