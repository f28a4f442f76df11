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
from tests.backends.export_models import hide_packages
from tests.checkpoint.fixtures.make_fixtures import model
from tests.checkpoint.hostile import (
    ABSENT_MODULE_SPEC,
    INPUT_PATHS,
    SUITE,
    as_recorded,
    rewrite,
    set_input_paths,
)
from tunetree.cli import main as cli_main
from tunetree.runtime.wrap import dispatcher_of

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


def _tuned_checkpoint(path: Path, backend: Any, shapes: list[tuple[int, ...]]) -> Path:
    """``path``: the fixture's model tuned whole with ``backend`` on random calls of ``shapes``."""
    result = tt.tune(
        model(),
        [torch.randn(shape) for shape in shapes],
        depth=0,
        strategy=tt.OneBackendStrategy(backend),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    tt.save(result, path)
    return path


# --- every hostile file: info never says "loads here" where load refuses ---------------------


def _refusal(path: Path) -> tt.TunetreeError | None:
    """Why ``tt.load`` refuses ``path`` (typed), or None when it loads and serves a call."""
    try:
        tuned = _load(path)
    except tt.TunetreeError as exc:
        return exc
    with torch.no_grad():
        tuned(torch.zeros(2, 8))
    return None


@pytest.mark.parametrize("name", sorted(SUITE))
def test_info_never_reports_compatible_where_load_refuses(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = SUITE[name](tmp_path / "hostile.tt")
    as_recorded(path, monkeypatch)  # the environment matches: only the file's content counts
    status, document = _info(path)
    refusal = _refusal(path)
    assert refusal is not None, name  # every file of the suite is hostile
    assert status != 0 and document["compatible"] is False, (name, refusal, document)
    assert document.get("members_verified") is not True


def test_info_and_load_both_accept_the_untouched_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file every hostile one is made from: both say it loads, and info read and checked
    its members (the weights and three OpenVINO runners of two files each)."""
    path = rewrite(tmp_path / "source.tt")
    as_recorded(path, monkeypatch)
    assert _refusal(path) is None
    status, document = _info(path)
    assert status == 0 and document["compatible"] is True and document["members_verified"]
    assert document["verified"] == {"members": 7, "runners": 3, "narrowed": []}


ARTIFACT_REFUSALS = {
    "output dtype changed": "OpenVINO model's 'linear:0' is float32, the saved record says "
    "torch.int64",
    "fixed size the artifact does not take": "input 0 takes sizes 2..2 on axis 0, where the "
    "graph's f32[3,8] has 3",
    "output structure naming a module": "names the type 'tt_hostile_absent.X', of a module "
    "'tt_hostile_absent' that is not installed here",
    "artifact fails its checksum": "'runners/0/model.bin' fails its checksum",
    "weights fail their checksum": "'weights.safetensors' fails its checksum",
}
"""Files of the suite refused for what their members hold (or, for the output structure, for
a type no model here returns), and the reason both give."""


@pytest.mark.parametrize("name", sorted(ARTIFACT_REFUSALS))
def test_info_refuses_what_the_members_contradict_with_loads_reason(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, info said "compatible", exit 0, ``members_verified: false`` for the first three
    (and the checksums were load's alone): it read the header and the manifest only."""
    path = SUITE[name](tmp_path / "hostile.tt")
    as_recorded(path, monkeypatch)
    refusal = _refusal(path)
    assert isinstance(refusal, tt.CheckpointError | tt.BackendError)
    assert ARTIFACT_REFUSALS[name] in str(refusal)
    status, document = _info(path)
    assert status == 2 and document["compatible"] is False
    assert document["error"] == str(refusal)


def test_info_reads_artifacts_into_a_private_directory_it_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    made: list[str] = []
    real = tempfile.mkdtemp

    def spy(*args: Any, **kwargs: Any) -> str:
        made.append(real(*args, **kwargs))
        return made[-1]

    path = rewrite(tmp_path / "a.tt")
    as_recorded(path, monkeypatch)
    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    assert _info(path)[0] == 0
    assert made and all("tunetree-info-" in d and not os.path.exists(d) for d in made)


def test_info_names_no_module_of_the_file_to_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output structure naming a type of a module that is there: info looks the module up
    by its top-level name without running it (whether the model returns that type is for
    tt.load, which has the model, to say)."""
    marker = tmp_path / "imported"
    package = tmp_path / "tt_hostile_present"
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (package / "sub.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = ABSENT_MODULE_SPEC.replace("tt_hostile_absent.X", "tt_hostile_present.sub.X")
    path = rewrite(
        tmp_path / "a.tt",
        manifest=lambda m: m["entries"][0]["runner"]["outputs"].update(spec=spec),
    )
    as_recorded(path, monkeypatch)
    _info(path)
    assert not marker.exists() and "tt_hostile_present" not in sys.modules
    with pytest.raises(tt.BackendError, match="output structure differs"):
        _load(path)
    assert not marker.exists()


def test_info_without_the_package_the_artifacts_need_claims_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """openvino not installed: info cannot read the OpenVINO models, and says so."""
    path = rewrite(tmp_path / "a.tt")
    as_recorded(path, monkeypatch)
    hide_packages(monkeypatch, "openvino")
    status, document = _info(path)
    assert status == 1 and document["compatible"] is False
    assert document["members_verified"] is False and document["verified"] is None
    assert "openvino is not installed" in document["refusal"]
    with pytest.raises(tt.IncompatibleCheckpointError, match="openvino is not installed"):
        _load(path)


def test_a_package_missing_while_reading_artifacts_is_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should reading an artifact still need a package this environment lacks, info and load
    both call the file incompatible here, not damaged."""
    from tunetree.backends import openvino as ov_backend

    def missing() -> Any:
        raise ModuleNotFoundError("No module named 'openvino'", name="openvino")

    path = rewrite(tmp_path / "a.tt")
    as_recorded(path, monkeypatch)
    monkeypatch.setattr(ov_backend, "_core", missing)
    monkeypatch.setattr(ov_backend.OpenVINO, "unavailable_reason", lambda self, device: None)
    status, document = _info(path)
    assert status == 1 and document["compatible"] is False and not document["members_verified"]
    assert "needs a package this environment lacks" in document["refusal"]
    with pytest.raises(tt.IncompatibleCheckpointError, match="needs a package"):
        _load(path)


# --- the same over an ONNX Runtime checkpoint ---------------------------------------------------


@pytest.fixture(scope="module")
def onnx_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint of the fixture's model, one ONNX Runtime runner for the whole model."""
    pytest.importorskip("onnxruntime")
    directory = tmp_path_factory.mktemp("onnx")
    return _tuned_checkpoint(directory / "onnx.tt", tt.backends.OnnxRuntime(), [(2, 8)])


ONNX_EDITS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "output dtype changed": lambda e: e["runner"]["outputs"].update(dtypes=["int64"]),
    "fixed size the artifact does not take": lambda e: e["graph"]["args"][0].update(shape=[3, 8]),
    "output structure naming a module": lambda e: e["runner"]["outputs"].update(
        structure=None, spec=ABSENT_MODULE_SPEC
    ),
}
"""The three edits refused from what the artifact (or the environment) holds, applied to the
ONNX checkpoint's entry, and the reason both give."""
ONNX_REFUSALS = {
    "output dtype changed": "ONNX model's 'output_0' is float32, the saved record says torch.int64",
    "fixed size the artifact does not take": "input 0 takes sizes 2..2 on axis 0",
    "output structure naming a module": "of a module 'tt_hostile_absent' that is not installed",
}


@pytest.mark.parametrize("name", sorted(ONNX_EDITS))
def test_info_checks_onnx_artifacts_as_load_does(
    name: str, onnx_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    untouched = rewrite(tmp_path / "untouched.tt", source=onnx_source)
    as_recorded(untouched, monkeypatch)
    assert _refusal(untouched) is None
    status, document = _info(untouched)
    assert status == 0 and document["verified"] == {"members": 3, "runners": 1, "narrowed": []}
    hostile = rewrite(
        tmp_path / "hostile.tt",
        source=onnx_source,
        manifest=lambda m: ONNX_EDITS[name](m["entries"][0]),
    )
    as_recorded(hostile, monkeypatch)
    refusal = _refusal(hostile)
    assert refusal is not None and ONNX_REFUSALS[name] in str(refusal)
    status, document = _info(hostile)
    assert status == 2 and document["compatible"] is False and document["error"] == str(refusal)


def test_the_suite_is_refused_by_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file of the suite is hostile: load refuses each (typed), else the tests above
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
    assert document["compatible"] is False and "does not list" in document["error"]


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
    path = tmp_path_factory.mktemp("ranged") / "ranged.tt"
    return _tuned_checkpoint(path, tt.backends.OpenVINO(), [(b, 8) for b in (2, 5, 8)])


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
    status, document = _info(path)  # a narrowed range loads: info and load agree
    assert status == 0 and document["verified"]["narrowed"] == [
        {"entry": 0, "serves": "(f32[batch 2..8, 8])"}
    ]


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
    from tunetree.runtime.artifacts import FLOOR_ELEMENTS, allowed_elements

    assert allowed_elements(7_000) == FLOOR_ELEMENTS
    assert allowed_elements(1 << 30) == 4 << 30  # a 1 GiB checkpoint: 4 Gi elements
