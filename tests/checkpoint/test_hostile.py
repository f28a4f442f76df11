"""Hostile checkpoints (issue 13): every file here is a real checkpoint edited the way an
attacker would, checksums recomputed. Nothing named by the file may run, every refusal is a
typed ``TunetreeError``, memory stays bounded, and no file outside the load's private
directory is opened."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

import tunetree as tt
from tests.checkpoint.fixtures.make_fixtures import model
from tests.checkpoint.hostile import SOURCE, as_recorded, parts, patch_zip_member, rewrite
from tunetree.cli import main as cli_main

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None, reason="the fixture holds OpenVINO runners"
)
REPO = Path(__file__).resolve().parents[2]


def _load(path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> Any:
    as_recorded(path, monkeypatch)
    return tt.load(model(), path, **kwargs)


def _set_backend(kind: str, config: dict[str, Any]) -> Any:
    def edit(m: dict[str, Any]) -> None:
        for entry in m["entries"]:
            entry["backend"] = {"kind": kind, "config": config, "name": kind}

    return edit


def _backend_file(path: Path, kind: str, config: dict[str, Any]) -> Path:
    """The fixture with every entry's backend replaced, the record listing that backend and
    its libraries (as a file saved with that backend would)."""
    from tunetree.checkpoint.environment import backend_libraries, library_version

    def record(r: dict[str, Any]) -> None:
        r["backends"] = sorted({*r["backends"], kind})
        for lib in backend_libraries(kind):
            r["versions"][lib] = library_version(lib)

    return rewrite(path, manifest=_set_backend(kind, config), record=record)


def _marker_program(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that, if anything runs it, leaves a marker file."""
    marker = tmp_path / "ran"
    program = tmp_path / "evil.sh"
    program.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program, marker


# --- 1. backend options naming programs and paths -------------------------------------------


@pytest.mark.parametrize("option", ["cpp.cxx", "cpp.march", "trace.debug_dir", "trace.enabled"])
def test_inductor_options_naming_programs_are_refused(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program, marker = _marker_program(tmp_path)
    value: Any = str(program) if option != "cpp.march" else f"native -wrapper {program}"
    value = True if option == "trace.enabled" else value
    config = {"mode": None, "dynamic": False, "fullgraph": False, "options": [[option, value]]}
    path = _backend_file(tmp_path / "a.tt", "inductor", config)
    with pytest.raises(tt.UntrustedConfigError, match="trust_config"):
        tuned = _load(path, monkeypatch)
        tuned(__import__("torch").zeros(2, 8))  # old code compiled (and ran cxx) here
    assert not marker.exists()


def test_trust_config_admits_a_config_the_user_vouches_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {"mode": None, "dynamic": False, "fullgraph": False, "options": [["cpp.threads", 2]]}
    path = _backend_file(tmp_path / "a.tt", "inductor", config)
    assert _load(path, monkeypatch) is not None  # cpp.threads is on the allow-list
    unsafe = {**config, "options": [["cpp.cxx", "g++"]]}
    path = _backend_file(tmp_path / "b.tt", "inductor", unsafe)
    with pytest.raises(tt.UntrustedConfigError):
        _load(path, monkeypatch)
    assert _load(path, monkeypatch, trust_config=True) is not None


@pytest.mark.parametrize(
    ("kind", "config"),
    [
        ("onnxruntime", {"intra_op_num_threads": 10**9}),
        ("onnxruntime", {"providers": [["CPUExecutionProvider", {"x": 1}]]}),
        ("onnxruntime", {"providers": ["/tmp/libevil.so"]}),
        ("onnxruntime-int8", {"weight_type": "int4"}),
        ("onnxruntime-int8", {"per_channel": "yes"}),
        ("onnxruntime-int8", {"op_types": ["MatMul", "MyCustomOp"]}),
        ("openvino", {"device": "HETERO:/etc/passwd"}),
        ("openvino", {"device": ["CPU"]}),
        ("openvino", {"num_threads": 10**9}),
        ("openvino", {"cache_dir": "/tmp"}),
        ("autocast", {"dtype": "../../x y"}),
    ],
)
def test_other_backend_configs_are_allow_listed(
    kind: str, config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _backend_file(tmp_path / "a.tt", kind, config)
    with pytest.raises(tt.UntrustedConfigError):
        _load(path, monkeypatch)


# --- 2. output structure naming modules -------------------------------------------------------


def _spec_with_enum(module: str) -> str:
    context = json.dumps([{"__enum__": True, "fqn": f"{module}:X", "name": "a"}])
    leaf = {"type": None, "context": None, "children_spec": []}
    return json.dumps([1, {"type": "builtins.dict", "context": context, "children_spec": [leaf]}])


@pytest.mark.parametrize("spec_type", ["enum", "type"])
def test_output_structure_never_imports(
    spec_type: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    name = f"tt_hostile_{spec_type}"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\nX = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    leaf = {"type": None, "context": None, "children_spec": []}
    spec = (
        _spec_with_enum(name)
        if spec_type == "enum"
        else json.dumps([1, {"type": f"{name}.X", "context": "null", "children_spec": [leaf]}])
    )

    def edit(m: dict[str, Any]) -> None:
        for entry in m["entries"]:
            entry["runner"]["outputs"]["spec"] = spec

    path = rewrite(tmp_path / "a.tt", manifest=edit)
    with pytest.raises(tt.TunetreeError):
        _load(path, monkeypatch)
    assert not marker.exists()
    sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("name", "refused"),
    [
        ("tt_hostile_absent.X", True),
        ("9x.Y", True),
        ("collections.namedtuple", False),
        ("torch.return_types.max", False),
        ("__main__.Out", False),
        ("distutils.X", False),
        ("NO_SERIALIZED_TYPE_NAME_FOUND", False),
    ],
)
def test_named_types_of_modules_absent_here_are_refused(name: str, refused: bool) -> None:
    """Looked up by the top-level name only, the standard library's without any finder (the
    setuptools finder imports on a lookup of ``distutils``); a name without a dot is left to
    the match against the model's output."""
    from tunetree.backends import structure

    before = set(sys.modules)
    if refused:
        with pytest.raises(tt.BackendError, match="not installed here"):
            structure.check_modules_present(["tuple", [["named", name, [["leaf"]]]]])
    else:
        structure.check_modules_present(["tuple", [["named", name, [["leaf"]]]]])
    assert set(sys.modules) == before


def test_saved_structure_round_trips_in_the_closed_vocabulary() -> None:
    import torch.utils._pytree as pytree

    from tunetree.backends import structure

    spec = pytree.tree_flatten(({"a": 1, "b": [2, 3]}, 4))[1]
    node = structure.describe(spec)
    assert node == [
        "tuple",
        [["dict", ["a", "b"], [["leaf"], ["list", [["leaf"], ["leaf"]]]]], ["leaf"]],
    ]
    # Always matched against the module's own (learnt) structure, plain containers too.
    assert structure.build(structure.check(node), lambda: spec) == spec
    other = pytree.tree_flatten(({"a": 1, "b": (2, 3)}, 4))[1]
    with pytest.raises(tt.BackendError, match="differs"):
        structure.build(structure.check(node), lambda: other)
    assert structure.from_pytree_json(pytree.treespec_dumps(spec)) == node


# --- 3. artifact paths outside the archive ------------------------------------------------------


@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_openvino_artifact_path_outside_the_archive(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = tmp_path / "planted.xml"
    with zipfile.ZipFile(_source()) as z:
        planted.write_bytes(z.read("runners/0/model.xml"))
        planted.with_suffix(".bin").write_bytes(z.read("runners/0/model.bin"))
    name = str(planted) if where == "absolute" else "../../../planted.xml"

    def edit(m: dict[str, Any]) -> None:
        for entry in m["entries"]:
            entry["runner"]["model"] = name

    path = rewrite(tmp_path / "a.tt", manifest=edit)
    opened: list[str] = []
    from tunetree.backends import openvino as ov_backend

    real = ov_backend._core

    class Spy:
        def __getattr__(self, attr: str) -> Any:
            target = getattr(real(), attr)
            if attr != "read_model":
                return target
            return lambda p, *a: (opened.append(str(p)), target(p, *a))[1]

    monkeypatch.setattr(ov_backend, "_core", lambda: Spy())
    with pytest.raises(tt.BackendError, match="not a plain file name"):
        _load(path, monkeypatch)
    assert opened == []


def _source() -> Path:
    from tests.checkpoint.hostile import SOURCE

    return SOURCE


def test_a_load_opens_no_file_outside_its_private_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file a load opens under the test's directory is the checkpoint itself; the rest
    are under the load's private ``tunetree-load-`` directory (audited through Python's
    ``open`` events; OpenVINO's own reads are checked in the test above)."""
    path = rewrite(tmp_path / "a.tt")
    (tmp_path / "model.xml").write_text("decoy")
    events: list[str] = []
    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if active[0] and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
            events.append(os.fsdecode(args[0]))

    sys.addaudithook(hook)
    try:
        _load(path, monkeypatch)
    finally:
        active[0] = False
    inside = [p for p in events if str(tmp_path) in os.path.abspath(p)]
    assert inside and all(Path(p).resolve() == path.resolve() for p in inside)


# --- 4. resources -------------------------------------------------------------------------------


def _under_memory_limit(path: Path, limit_gib: int = 3) -> str:
    """Load ``path`` in a child process whose address space is limited; returns what the
    child printed: ``ok``, ``typed: <error>`` or ``untyped: <error>``."""
    script = textwrap.dedent(
        f"""
        import json, resource, struct, sys
        import torch, tunetree as tt
        from tunetree.checkpoint import loading
        from tests.checkpoint.fixtures.make_fixtures import model
        data = open({str(path)!r}, "rb").read()
        n = struct.unpack("<II", data[:8])[1]
        rec = json.loads(data[8:8 + n])
        loading.environment_record = lambda kinds: rec
        m = model()
        limit = {limit_gib} << 30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            tuned = tt.load(m, {str(path)!r})
            tuned(torch.zeros(2, 8))
            print("ok")
        except tt.TunetreeError as exc:
            print("typed:", type(exc).__name__, str(exc)[:200])
        except BaseException as exc:
            print("untyped:", type(exc).__name__, str(exc)[:200])
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(REPO)]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    return done.stdout.strip() or done.stderr[-500:]


def test_a_huge_graph_shape_is_refused_before_allocating(tmp_path: Path) -> None:
    def edit(m: dict[str, Any]) -> None:
        entry = m["entries"][0]
        entry["graph"]["args"][0]["shape"] = [65536, 65536]
        entry["runner"]["outputs"]["spec"] = None  # makes the loader learn by running on zeros

    path = rewrite(tmp_path / "a.tt", manifest=edit)
    out = _under_memory_limit(path)
    assert out.startswith("typed:") and "elements" in out, out


def test_huge_saved_output_shapes_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def edit(m: dict[str, Any]) -> None:
        m["entries"][0]["runner"]["outputs"]["shapes"] = [[1 << 30, 1 << 30]]

    path = rewrite(tmp_path / "a.tt", manifest=edit)
    with pytest.raises(tt.BackendError, match="elements"):
        _load(path, monkeypatch)


def _weights_with_metadata(text: str) -> bytes:
    """The fixture's weights member with ``text`` as a ``__metadata__`` value."""
    _, members, _ = parts(SOURCE)
    weights = members["weights.safetensors"]
    (length,) = struct.unpack("<Q", weights[:8])
    header = json.loads(weights[8 : 8 + length])
    header["__metadata__"] = {**header.get("__metadata__", {}), "note": text}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + weights[8 + length :]


def test_50_mib_of_weights_metadata_is_refused_typed_in_bounded_memory(tmp_path: Path) -> None:
    """Before, reading the header took about 140 bytes per byte: MemoryError, untyped."""
    members = {"weights.safetensors": _weights_with_metadata("x" * (50 << 20))}
    path = rewrite(tmp_path / "a.tt", members=members)
    out = _under_memory_limit(path)
    assert out.startswith("typed: CheckpointError") and "metadata" in out, out


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_unbounded_decompressors_are_refused(
    method: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bzip2 and LZMA inflate without an output bound in zipfile (a 2.3 GB member came out
    of a few KB): only stored and deflate members are read."""
    path = rewrite(tmp_path / "a.tt", methods={"runners/0/model.bin": method})
    with pytest.raises(tt.CheckpointError, match="compression method"):
        _load(path, monkeypatch)


# --- 5. untyped errors and crashes -------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "method"), [(0x40, None), (0x20, None), (None, 9), (None, 99), (None, 1)]
)
def test_unsupported_zip_features_are_typed(
    flags: int | None, method: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rewrite(tmp_path / "a.tt")
    patch_zip_member(path, "runners/0/model.xml", flags=flags, method=method)
    with pytest.raises(tt.CheckpointError):
        _load(path, monkeypatch)


@pytest.mark.parametrize("member", ["runners/0/model.xml", "manifest.json"])
def test_a_zip_version_above_what_zipfile_reads_is_typed(
    member: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 19: "version needed to extract" 23.2 (found by the fuzzer) made zipfile raise an
    untyped NotImplementedError from tt.load and a traceback from tunetree info."""
    path = rewrite(tmp_path / "a.tt")
    patch_zip_member(path, member, version=232)
    with pytest.raises(tt.CheckpointError, match="zip"):
        _load(path, monkeypatch)
    capsys.readouterr()
    assert cli_main(["info", str(path)]) == 2
    assert "version" in capsys.readouterr().err
    assert cli_main(["info", "--json", str(path)]) == 2
    assert "error" in json.loads(capsys.readouterr().out)


def test_deep_json_is_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = b'{"x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    path = rewrite(tmp_path / "a.tt", manifest_bytes=deep)
    with pytest.raises(tt.CheckpointError):
        _load(path, monkeypatch)
    path = rewrite(tmp_path / "b.tt", record_bytes=deep)
    with pytest.raises(tt.CheckpointError):
        _load(path, monkeypatch)
    assert cli_main(["info", str(path)]) == 2


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["entries"][0].update(members=[["x"]]),
        lambda m: m["entries"][0].update(latency_s="fast"),
        lambda m: m["entries"][0].update(latency_s=10**400),
        lambda m: m.update(device="not a device"),
        lambda m: m.update(device="cuda:abc"),
        lambda m: m["entries"][0]["runner"].update(outputs=[]),
        lambda m: m["entries"][0]["runner"]["inputs"].update(
            paths=[[["a", "__class__"], ["i", 0]]]
        ),
        lambda m: m["entries"][0]["runner"]["outputs"].update(constants={"x": 1}),
        lambda m: m["entries"][0]["runner"]["outputs"].update(positions=[5]),
        lambda m: m["entries"][0].update(members=["runners/1/model.xml"]),
        lambda m: m["entries"][0]["graph"].update(args=[{"dtype": ["f32"], "shape": [2, 8]}]),
    ],
)
def test_wrong_manifest_types_are_typed(
    edit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rewrite(tmp_path / "a.tt", manifest=edit)
    with pytest.raises(tt.TunetreeError):
        _load(path, monkeypatch)


def test_a_member_that_is_also_a_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rewrite(tmp_path / "a.tt", members={"runners/0/model.xml/x": b"boo"})
    with pytest.raises(tt.CheckpointError, match="both as a file and as a directory"):
        _load(path, monkeypatch)


# --- 6. environment record and info ---------------------------------------------------------


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r["cpu"].update(logical_cores=2.5),
        lambda r: r.update(accelerators=None),
        lambda r: r.pop("accelerators"),
        lambda r: r["versions"].pop("openvino"),
        lambda r: r.update(backends=["eager"]),
    ],
)
def test_malformed_environment_records_are_refused(
    edit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rewrite(tmp_path / "a.tt", record=edit)
    with pytest.raises(tt.CheckpointError):
        _load(path, monkeypatch)


def test_info_escapes_control_characters_and_says_not_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = "\x1b]0;owned\x07\x1b[2J"

    def record(r: dict[str, Any]) -> None:
        r["host"] = f"vm{evil}"

    def manifest(m: dict[str, Any]) -> None:
        m["entries"][0]["path"] = f"0{evil}"

    path = rewrite(tmp_path / "a.tt", record=record, manifest=manifest)
    cli_main(["info", str(path)])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;owned" in out and "not verified" in out


@pytest.mark.parametrize("latency", ["slow", 10**400, [1]])
def test_info_does_not_crash_on_odd_latencies(latency: Any, tmp_path: Path) -> None:
    path = rewrite(tmp_path / "a.tt", manifest=lambda m: m["entries"][0].update(latency_s=latency))
    assert cli_main(["info", str(path)]) == 2


# --- 7. OpenVINO writes nothing under the home directory -------------------------------------


def test_openvino_load_writes_nothing_under_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    path = rewrite(tmp_path / "a.tt")
    script = textwrap.dedent(
        f"""
        import json, struct, torch, tunetree as tt
        from tunetree.checkpoint import loading
        from tests.checkpoint.fixtures.make_fixtures import model
        data = open({str(path)!r}, "rb").read()
        rec = json.loads(data[8:8 + struct.unpack("<II", data[:8])[1]])
        loading.environment_record = lambda kinds: rec
        tuned = tt.load(model(), {str(path)!r})
        tuned(torch.zeros(2, 8))
        print("loaded")
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(REPO)]),
        "HOME": str(home),
    }
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert "loaded" in done.stdout, done.stderr[-2000:]
    assert list(home.iterdir()) == []
