"""Property-based fuzzing of checkpoint reading (issue 13): a valid ``.tt`` file mutated at
random, as raw bytes and as manifest JSON with checksums recomputed. ``tt.load`` and
``tunetree info`` either succeed (loading with outputs equal to the original's) or raise a
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
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import tunetree as tt  # noqa: E402
from tests.checkpoint.fixtures.make_fixtures import inputs, model  # noqa: E402
from tests.checkpoint.hostile import SOURCE, rewrite  # noqa: E402
from tunetree.checkpoint import loading  # noqa: E402
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


def _outputs(tuned: Any) -> list[torch.Tensor]:
    with torch.no_grad():
        return [tuned(x) for x in inputs()]


with mock.patch.object(loading, "environment_record", lambda kinds: _record(SOURCE)):
    EXPECTED = _outputs(tt.load(model(), SOURCE))


def _check(path: Path) -> None:
    """The property: typed refusal or the original's outputs, for load and info."""
    with mock.patch.object(loading, "environment_record", lambda kinds: _record(path)):
        try:
            tuned = tt.load(model(), path)
        except tt.TunetreeError:
            pass
        else:
            for got, want in zip(_outputs(tuned), EXPECTED, strict=True):
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
