"""Hostile checkpoints, second round (issue 19): ``tunetree info`` runs the checks ``tt.load``
runs, runner records are checked against their graph at load, served ranges against what the
artifact declares, and what a load allocates on a file's word is bounded by the file's size.
Every file is a real checkpoint edited with its checksums recomputed (:mod:`.hostile`)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
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
from tests.checkpoint.fixtures.make_fixtures import model
from tests.checkpoint.hostile import (
    INPUT_PATHS,
    LOAD_ONLY,
    SUITE,
    as_recorded,
    rewrite,
    set_input_paths,
)
from tunetree.cli import main as cli_main
from tunetree.wrap import dispatcher_of

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None, reason="the fixture holds OpenVINO runners"
)
REPO = Path(__file__).resolve().parents[2]


def _info(path: Path) -> tuple[int, dict[str, Any]]:
    """``tunetree info --json``'s exit status and document (and that text mode agrees)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli_main(["info", "--json", str(path)])
    document = json.loads(out.getvalue())
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert cli_main(["info", str(path)]) == status
    assert "Traceback" not in err.getvalue()
    return status, document


def _load(path: Path) -> Any:
    return tt.load(model(), path)


# --- every hostile file: info never says "loads here" where load refuses ---------------------


@pytest.mark.parametrize("name", sorted(SUITE))
def test_info_never_reports_compatible_where_load_refuses(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = SUITE[name](tmp_path / "hostile.tt")
    as_recorded(path, monkeypatch)  # the environment matches: only the file's content counts
    status, document = _info(path)
    try:
        tuned = _load(path)
    except tt.TunetreeError as exc:
        refusal: tt.TunetreeError | None = exc
    else:
        refusal = None
        with torch.no_grad():
            tuned(torch.zeros(2, 8))
    if refusal is not None:
        assert status != 0 and document.get("compatible") is not True, (name, refusal)
    else:
        assert status == 0 and document["compatible"] is True, (name, document)


@pytest.mark.parametrize("name", sorted(LOAD_ONLY))
def test_what_only_a_load_can_refuse_is_refused_typed_and_info_says_unverified(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = LOAD_ONLY[name](tmp_path / "hostile.tt")
    as_recorded(path, monkeypatch)
    status, document = _info(path)
    assert status == 0 and document["members_verified"] is False
    with pytest.raises(tt.BackendError):
        _load(path)


def test_the_suite_is_refused_by_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file of the suite is hostile: load refuses each (typed), else the test above
    would prove nothing for it."""
    loaded = []
    for number, (name, build) in enumerate(SUITE.items()):
        path = build(tmp_path / f"{number}.tt")
        as_recorded(path, monkeypatch)
        with contextlib.suppress(tt.TunetreeError):
            _load(path)
            loaded.append(name)
    assert loaded == []


# --- 1. info runs load's checks ----------------------------------------------------------------


@pytest.mark.parametrize(
    "edit",
    [lambda r: r["versions"].pop("openvino"), lambda r: r.update(backends=["eager"])],
    ids=["versions without openvino", "backends without openvino"],
)
def test_info_refuses_a_record_that_does_not_list_what_the_plan_needs(
    edit: Callable[[dict[str, Any]], Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record resealed without openvino: load refused, info said "identical, the
    checkpoint loads here", exit 0 and ``"compatible": true``."""
    path = rewrite(tmp_path / "a.tt", record=edit)
    as_recorded(path, monkeypatch)
    with pytest.raises(tt.CheckpointError, match="does not list what the plan needs"):
        _load(path)
    status, document = _info(path)
    assert status == 2
    assert "compatible" not in document and "does not list" in document["error"]


def test_info_reports_a_backend_unavailable_here_as_incompatible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sound file whose plan needs what this environment lacks: exit 1, not "loads here"."""
    from tunetree.backends.openvino import OpenVINO

    path = rewrite(tmp_path / "a.tt")
    as_recorded(path, monkeypatch)
    monkeypatch.setattr(OpenVINO, "unavailable_reason", lambda self, device: "no plugin")
    with pytest.raises(tt.IncompatibleCheckpointError, match="no plugin"):
        _load(path)
    status, document = _info(path)
    assert status == 1 and document["compatible"] is False and "no plugin" in document["refusal"]


# --- 3. saved input paths are checked against the graph at load --------------------------------


@pytest.mark.parametrize("name", sorted(INPUT_PATHS))
def test_saved_input_paths_are_checked_against_the_graph_at_load(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, these loaded and the first call raised IndexError, AttributeError, TypeError or
    an OpenVINO RuntimeError."""
    path = rewrite(tmp_path / "a.tt", manifest=set_input_paths(*INPUT_PATHS[name]))
    as_recorded(path, monkeypatch)
    with pytest.raises(tt.BackendError, match=r"input path|twice"):
        _load(path)


def test_input_paths_that_fit_the_graph_still_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rewrite(tmp_path / "a.tt", manifest=set_input_paths([["i", 0], ["i", 0]]))
    as_recorded(path, monkeypatch)
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(_load(path)(x), model()(x))


# --- 4. served ranges are checked against the artifact ----------------------------------------


@pytest.fixture(scope="module")
def ranged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint of the fixture's model tuned with OpenVINO for batch 2..8."""
    data = [torch.randn(b, 8) for b in (2, 5, 8)]
    result = tt.tune(
        model(),
        data,
        depth=0,
        strategy=tt.OneBackendStrategy(tt.backends.OpenVINO()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    path = tmp_path_factory.mktemp("ranged") / "ranged.tt"
    tt.save(result, path)
    return path


def _set_range(low: int, high: int) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        m["entries"][0]["graph"]["args"][0]["shape"][0].update(min=low, max=high)

    return edit


def test_a_range_wider_than_the_artifact_is_narrowed(
    ranged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Tuned for batch 2..8, the manifest edited to 1..1000000: before, batches 1, 9 and 100
    reached OpenVINO and raised an untyped RuntimeError; the unedited file serves them with the
    original forward (with a warning). Now the edited one does the same."""
    path = rewrite(tmp_path / "wide.tt", manifest=_set_range(1, 1_000_000), source=ranged)
    as_recorded(path, monkeypatch)
    tuned = _load(path)
    dispatcher = dispatcher_of(tuned)
    assert dispatcher is not None
    reference = model()
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        for batch in (4, 1, 9, 100):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(tuned(x), reference(x), atol=1e-5, rtol=1e-5)
    assert dispatcher.fallback_calls == 3  # 1, 9 and 100; batch 4 ran the runner
    assert "outside the tuned range" in caplog.text
    (key,) = dispatcher.runners
    assert str(key) == "(f32[batch 2..8, 8])"
    assert _info(path)[0] == 0  # a narrowed range loads: info and load agree


def test_a_fixed_size_the_artifact_does_not_take_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graph's fixed batch 2 edited to 3: the model's static input shape is [2,8]."""

    def edit(m: dict[str, Any]) -> None:
        m["entries"][0]["graph"]["args"][0]["shape"] = [3, 8]

    path = rewrite(tmp_path / "a.tt", manifest=edit)
    as_recorded(path, monkeypatch)
    with pytest.raises(tt.BackendError, match="does not fit its graph"):
        _load(path)


def test_a_range_disjoint_from_the_artifact_is_refused(
    ranged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rewrite(tmp_path / "far.tt", manifest=_set_range(100, 200), source=ranged)
    as_recorded(path, monkeypatch)
    with pytest.raises(tt.BackendError, match="serves no size"):
        _load(path)


def test_a_runner_refusing_a_call_raises_a_typed_error(
    ranged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should a call still reach a runner that cannot serve it, the error is typed."""
    as_recorded(ranged, monkeypatch)
    tuned = _load(ranged)
    (runner,) = dispatcher_of(tuned).runners.values()  # type: ignore[union-attr]
    with torch.no_grad(), pytest.raises(tt.BackendError, match="OpenVINO refused"):
        runner(torch.zeros(100, 8))


# --- 5. memory before refusal -------------------------------------------------------------------


def _peak_in_child(path: Path) -> tuple[str, int]:
    """Load ``path`` in a child process: its outcome and how many MiB its peak memory grew."""
    script = textwrap.dedent(
        f"""
        import json, resource, struct
        import torch, tunetree as tt
        from tunetree.checkpoint import loading
        from tests.checkpoint.fixtures.make_fixtures import model
        data = open({str(path)!r}, "rb").read()
        rec = json.loads(data[8:8 + struct.unpack("<II", data[:8])[1]])
        loading.environment_record = lambda kinds: rec
        m = model()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            tt.load(m, {str(path)!r})(torch.zeros(2, 8))
            outcome = "ok"
        except tt.TunetreeError as exc:
            outcome = "typed: " + type(exc).__name__ + ": " + str(exc)[:300]
        except BaseException as exc:
            outcome = "untyped: " + type(exc).__name__
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


def test_placeholders_from_a_file_are_bounded_by_its_size(tmp_path: Path) -> None:
    """A graph of [16384, 16384] with the output structure removed (the loader learns it by
    running the module on placeholders): the 2^28-element cap admitted exactly this and the
    load reached 1.29 GB before a typed refusal."""
    from tests.checkpoint.hostile import SUITE

    path = SUITE["huge learnt graph"](tmp_path / "a.tt")
    outcome, grown = _peak_in_child(path)
    assert outcome.startswith("typed: BackendError") and "placeholder" in outcome, outcome
    assert grown < 200, f"peak memory grew {grown} MiB before the refusal"


def test_saved_output_shapes_are_bounded_by_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.checkpoint.hostile import SUITE

    path = SUITE["large output shapes"](tmp_path / "a.tt")
    as_recorded(path, monkeypatch)
    with pytest.raises(tt.BackendError, match="elements"):
        _load(path)


def test_the_bound_grows_with_the_file() -> None:
    from tunetree.artifacts import FLOOR_ELEMENTS, allowed_elements

    assert allowed_elements(7_000) == FLOOR_ELEMENTS
    assert allowed_elements(1 << 30) == 4 << 30  # a 1 GiB checkpoint: 4 Gi elements
