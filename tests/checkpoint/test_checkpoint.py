"""The .tt checkpoint: round trips without tuning, and every refusal with a clear message.

Hostile and damaged files are built by hand from a real checkpoint (see :func:`rewrite`);
each refusal is checked for its error type and for a message that says what is wrong.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import tunetree as tt
import tunetree.backends
from tunetree import checkpoint
from tunetree.backends.base import Backend, Runner
from tunetree.backends.registry import BUILTIN_BACKENDS
from tunetree.checkpoint import format as checkpoint_format
from tunetree.checkpoint import writer
from tunetree.runtime.wrap import wrapped_paths
from tunetree.signature.binding import original_forward
from tunetree.signature.graph import Graph, GraphKey, TensorSpec

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]

# --- models


class Tiny(nn.Module):
    """Depth 0: the model; depth 1: body, head; depth 2: body.0, body.1, body.2, head."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Tied(nn.Module):
    """An embedding and an output projection that share one weight tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.mix = nn.Linear(16, 16)
        self.out = nn.Linear(16, 50, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.mix(self.embed(ids))))


def encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(32, 2, dim_feedforward=64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def tiny(seed: int = 0, width: int = 32) -> nn.Module:
    torch.manual_seed(seed)
    return Tiny(width).eval()


def data(n: int = 2, batch: int = 4) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    return [torch.randn(batch, 16, generator=g) for _ in range(n)]


def tune(model: Any, backend: Backend, depth: int, dataset: list[Any] | None = None) -> Any:
    return tt.tune(
        model,
        dataset or data(),
        depth=depth,
        strategy=tt.OneBackendStrategy(backend),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
    )


def outputs(model: Any, dataset: list[Any]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(x) for x in dataset]


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y), f"max difference {(x - y).abs().max().item()}"


# --- a backend with artifacts


class ArtifactRunner(Runner):
    """Adds the offset stored in its artifact (0.0) to the forward: a load that skipped
    the artifact could not run at all."""

    def __init__(self, backend: Backend, module: nn.Module, offset: float) -> None:
        super().__init__(backend)
        self.forward = original_forward(module)
        self.offset = offset

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs) + self.offset

    def save(self, directory: Path) -> dict[str, Any]:
        assert isinstance(self.backend, ArtifactBackend)
        (directory / "nested").mkdir()
        (directory / "nested" / "offset.json").write_text(json.dumps({"offset": self.offset}))
        (directory / "blob.bin").write_bytes(bytes(range(256)) * 16)
        return {"tag": self.backend.tag}


@dataclasses.dataclass(frozen=True)
class ArtifactBackend(Backend):
    """A test backend whose runners write artifact files and read them back on load."""

    kind: ClassVar[str] = "test-artifact"
    tag: str = "a"
    delay_s: float = 0.0

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        runner = ArtifactRunner(self, module, 0.0)
        if self.delay_s:
            forward = runner.forward

            def slow(*args: Any, **kwargs: Any) -> Any:
                end = time.perf_counter() + self.delay_s
                while time.perf_counter() < end:
                    pass
                return forward(*args, **kwargs)

            runner.forward = slow
        return runner

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        description: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        assert description == {"tag": self.tag}
        assert (directory / "blob.bin").read_bytes() == bytes(range(256)) * 16
        offset = json.loads((directory / "nested" / "offset.json").read_text())["offset"]
        return ArtifactRunner(self, module, offset)


@pytest.fixture
def artifact_backend() -> ArtifactBackend:
    """:class:`ArtifactBackend` (registered by being defined, so checkpoints can rebuild it)."""
    return ArtifactBackend()


@pytest.fixture
def no_builds(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it after tuning: from then on any backend build fails the test."""

    def forbid() -> None:
        def build(self: Backend, *args: Any, **kwargs: Any) -> Runner:
            raise AssertionError(f"{self.name} built a runner while loading: load must not tune")

        for cls in {*BUILTIN_BACKENDS, ArtifactBackend}:
            monkeypatch.setattr(cls, "build", build)

    return forbid


# --- file surgery


@dataclasses.dataclass
class Parts:
    """A .tt file taken apart: version, record, and every archive member's bytes."""

    version: int
    record: dict[str, Any]
    members: dict[str, bytes]

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads(self.members["manifest.json"])

    @manifest.setter
    def manifest(self, value: dict[str, Any]) -> None:
        self.members["manifest.json"] = json.dumps(value).encode()

    def set_member(self, name: str, data: bytes) -> None:
        """Add or replace a member and record its true checksum in the manifest."""
        self.members[name] = data
        manifest = self.manifest
        manifest["members"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        self.manifest = manifest


def split(path: Path) -> Parts:
    raw = path.read_bytes()
    version, length = struct.unpack_from("<II", raw)
    record = json.loads(raw[8 : 8 + length])
    with zipfile.ZipFile(path) as archive:
        members = {i.filename: archive.read(i) for i in archive.infolist()}
    return Parts(version, record, members)


def join(parts: Parts, path: Path, *, bind: bool = True) -> None:
    """Write ``parts`` as a .tt file; ``bind`` re-binds the manifest to the record."""
    record = json.dumps(parts.record, sort_keys=True).encode()
    if bind:
        manifest = parts.manifest
        manifest["environment_sha256"] = hashlib.sha256(record).hexdigest()
        parts.manifest = manifest
    with open(path, "wb") as f:
        f.write(struct.pack("<II", parts.version, len(record)) + record)
        with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in parts.members.items():
                archive.writestr(zipfile.ZipInfo(name), data, zipfile.ZIP_DEFLATED)


def rewrite(path: Path, change: Callable[[Parts], None], *, bind: bool = True) -> None:
    parts = split(path)
    change(parts)
    join(parts, path, bind=bind)


@pytest.fixture
def saved(tmp_path: Path, artifact_backend: ArtifactBackend) -> tuple[Path, list[torch.Tensor]]:
    """A depth-1 checkpoint whose runners have artifacts, and the tuned model's outputs."""
    result = tune(tiny(), artifact_backend, 1)
    path = tt.save(result, tmp_path / "model.tt")
    return path, outputs(result.model, data(3))


def load_fresh(path: Path, **kwargs: Any) -> Any:
    return tt.load(tiny(seed=7), path, **kwargs)


# --- graph keys


def test_graph_key_json_round_trip() -> None:
    @dataclasses.dataclass
    class Config:
        scale: float
        mode: str

    key = GraphKey.of(
        (torch.zeros(2, 3), [torch.ones(4, dtype=torch.int64), None], {"m": torch.zeros(1)}),
        {
            "flag": True,
            "n": 3,
            "eps": 1e-5,
            "name": "x",
            "dtype": torch.float16,
            "cfg": Config(0.5, "fast"),
            "obj": object(),
            "nested": ((torch.zeros(()), 2.0),),
        },
    )
    back = GraphKey.from_json(json.loads(json.dumps(key.to_json())))
    assert back == key and hash(back) == hash(key) and back.digest() == key.digest()
    assert isinstance(back.args[0], TensorSpec) and back.args[0].shape == (2, 3)
    with pytest.raises(ValueError, match="tensor signature"):
        GraphKey.from_json({"args": [{"dtype": "f32", "shape": ["x"]}], "kwargs": []})
    with pytest.raises(ValueError, match="exactly"):
        GraphKey.from_json({"args": []})


# --- round trips


def _backends() -> list[Backend]:
    """Every backend tunetree knows, with its default configuration."""
    return [cls() for cls in BUILTIN_BACKENDS]


def _backend_params() -> list[Any]:
    params = []
    for backend in _backends():
        reason = backend.unavailable_reason(CPU)
        for depth in (0, 1, 2):
            # Compilers take seconds per graph on a cold cache: deeper cuts run with -m slow.
            marks = [pytest.mark.slow] if backend.kind == "inductor" and depth else []
            if reason is not None:
                marks.append(pytest.mark.skip(reason=f"{backend.kind}: {reason}"))
            params.append(pytest.param(backend, depth, marks=marks, id=f"{backend.kind}-{depth}"))
    return params


@pytest.mark.parametrize(("backend", "depth"), _backend_params())
def test_round_trip_every_backend(
    backend: Backend, depth: int, tmp_path: Path, no_builds: Callable[[], None]
) -> None:
    result = tune(tiny(), backend, depth)
    assert result.plan.entries, f"{backend.name} won no graph at depth {depth}"
    expected = outputs(result.model, data(3))
    path = tt.save(result, tmp_path / "model.tt")
    no_builds()
    loaded = load_fresh(path)
    assert_same(outputs(loaded, data(3)), expected)
    assert sorted(wrapped_paths(loaded)) == sorted(result.plan.runners())


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_round_trip_with_artifacts(
    depth: int, tmp_path: Path, artifact_backend: ArtifactBackend, no_builds: Callable[[], None]
) -> None:
    result = tune(tiny(), artifact_backend, depth)
    expected = outputs(result.model, data(3))
    path = tt.save(result, tmp_path / "model.tt")
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    assert {f"runners/{n}/blob.bin" for n in range(len(result.plan.entries))} <= names
    no_builds()
    loaded = load_fresh(path)
    assert_same(outputs(loaded, data(3)), expected)
    assert sorted(wrapped_paths(loaded)) == sorted(result.plan.runners())


def _cuda_params() -> list[Any]:
    cuda = torch.device("cuda")
    params = []
    for backend in _backends():
        reason = backend.unavailable_reason(cuda) if torch.cuda.is_available() else "no CUDA"
        marks = [pytest.mark.skip(reason=f"{backend.kind}: {reason}")] if reason else []
        for depth in (0, 1, 2):
            params.append(pytest.param(backend, depth, marks=marks, id=f"{backend.kind}-{depth}"))
    return params


@pytest.mark.gpu
@pytest.mark.parametrize(("backend", "depth"), _cuda_params())
def test_round_trip_on_cuda(
    backend: Backend, depth: int, tmp_path: Path, no_builds: Callable[[], None]
) -> None:
    dataset = [x.cuda() for x in data(3)]
    result = tune(tiny().cuda(), backend, depth, dataset)
    expected = outputs(result.model, dataset)
    path = tt.save(result, tmp_path / "model.tt")
    assert checkpoint.read_info(path).manifest.device.startswith("cuda")
    no_builds()
    loaded = tt.load(tiny(seed=7), path, device="cuda")
    assert_same(outputs(loaded, dataset), expected)
    with pytest.raises(tt.IncompatibleCheckpointError, match="tuned on cuda"):
        tt.load(tiny(seed=7), path)  # a CPU model for a plan tuned on the GPU


@pytest.mark.slow
@pytest.mark.parametrize("backend", _backends(), ids=lambda b: b.kind)
def test_round_trip_encoder(
    backend: Backend, tmp_path: Path, no_builds: Callable[[], None]
) -> None:
    if backend.unavailable_reason(CPU):
        pytest.skip(str(backend.unavailable_reason(CPU)))
    g = torch.Generator().manual_seed(0)
    dataset = [torch.randn(2, 8, 32, generator=g) for _ in range(2)]
    torch.manual_seed(0)
    result = tune(encoder(), backend, 1, dataset)
    expected = outputs(result.model, dataset)
    path = tt.save(result, tmp_path / "encoder.tt")
    no_builds()
    torch.manual_seed(1)
    assert_same(outputs(tt.load(encoder(), path), dataset), expected)


def test_save_tuned_model_equals_save_result(
    tmp_path: Path, artifact_backend: ArtifactBackend
) -> None:
    result = tune(tiny(), artifact_backend, 2)
    from_result = checkpoint.read_info(tt.save(result, tmp_path / "r.tt"))
    from_model = checkpoint.read_info(tt.save(result.model, tmp_path / "m.tt"))
    keys = [(r["path"], r["graph"], r["backend"]) for r in from_result.plan_rows()]
    assert keys == [(r["path"], r["graph"], r["backend"]) for r in from_model.plan_rows()]
    # The dispatchers carry the plan, so saving result.model keeps depth and latencies.
    assert from_result.manifest.depth == 2 and from_model.manifest.depth == 2
    assert all(r["latency_s"] for r in from_result.plan_rows())
    assert all(r["latency_s"] for r in from_model.plan_rows())
    assert_same(outputs(load_fresh(tmp_path / "m.tt"), data()), outputs(result.model, data()))


def test_depth_zero_model_and_untuned_model(tmp_path: Path) -> None:
    model = tiny()
    # An untuned model saves its weights and an empty plan; loading returns the model itself.
    path = tt.save(model, tmp_path / "plain.tt")
    fresh = tiny(seed=3)
    assert tt.load(fresh, path) is fresh
    assert_same(outputs(fresh, data()), outputs(model, data()))


def test_tied_weights_round_trip(tmp_path: Path, artifact_backend: ArtifactBackend) -> None:
    torch.manual_seed(0)
    ids = [torch.randint(0, 50, (2, 5)) for _ in range(2)]
    result = tune(Tied().eval(), artifact_backend, 1, ids)
    path = tt.save(result, tmp_path / "tied.tt")
    torch.manual_seed(5)
    fresh = Tied().eval()
    loaded = tt.load(fresh, path)
    assert fresh.out.weight is fresh.embed.weight
    assert_same(outputs(loaded, ids), outputs(result.model, ids))


def test_directory_checkpoint(tmp_path: Path, artifact_backend: ArtifactBackend) -> None:
    result = tune(tiny(), artifact_backend, 1)
    target = tmp_path / "model.ttdir"
    tt.save(result, target, compress_checkpoint=False)
    assert (target / "tunetree-format").read_text().strip() == "1"
    assert json.loads((target / "environment.json").read_text())["versions"]["torch"]
    assert (target / "manifest.json").is_file() and (
        target / "runners" / "0" / "blob.bin"
    ).is_file()
    assert_same(outputs(load_fresh(target), data()), outputs(result.model, data()))

    # Saving again replaces the directory; nothing is left beside it.
    tt.save(result, target, compress_checkpoint=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ttdir"]

    # The directory is checked like the file: environment, then checksums.
    record = json.loads((target / "environment.json").read_text())
    (target / "environment.json").write_text(json.dumps({**record, "host": "elsewhere"}))
    with pytest.raises(tt.IncompatibleCheckpointError, match="host: tuned 'elsewhere'"):
        load_fresh(target)
    with pytest.raises(tt.CheckpointError, match="does not belong"):
        load_fresh(target, ignore=("host",))
    (target / "environment.json").write_text(json.dumps(record, sort_keys=True))
    blob = target / "runners" / "0" / "blob.bin"
    blob.write_bytes(b"x" + blob.read_bytes()[1:])
    with pytest.raises(tt.CheckpointError, match="checksum"):
        load_fresh(target)
    (target / "tunetree-format").write_text("2\n")
    with pytest.raises(tt.IncompatibleCheckpointError, match="format version 2"):
        load_fresh(target)


def test_save_refuses_to_replace_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("precious")
    with pytest.raises(tt.InvalidInputError, match="not a tunetree checkpoint"):
        tt.save(tiny(), tmp_path, compress_checkpoint=False)
    assert (tmp_path / "keep.txt").read_text() == "precious"


def test_file_layout(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved
    raw = path.read_bytes()
    version, length = struct.unpack_from("<II", raw)
    assert version == checkpoint.FORMAT_VERSION == 1
    record = json.loads(raw[8 : 8 + length].decode("utf-8"))
    assert {"host", "os", "cpu", "accelerators", "versions", "backends"} <= set(record)
    assert {"python", "torch", "tunetree"} <= set(record["versions"])
    assert raw[8 + length : 12 + length] == b"PK\x03\x04"
    parts = split(path)
    manifest = parts.manifest
    assert set(parts.members) == {"manifest.json", *manifest["members"]}
    for name, meta in manifest["members"].items():
        assert hashlib.sha256(parts.members[name]).hexdigest() == meta["sha256"]
    entry = manifest["entries"][0]
    assert entry["backend"] == {
        "kind": "test-artifact",
        "name": "test-artifact",
        "config": {"tag": "a", "delay_s": 0.0},
    }
    assert GraphKey.from_json(entry["graph"]) == GraphKey.of((data()[0],), {})
    assert manifest["depth"] == 1 and manifest["device"] == "cpu"
    assert {"latency_s", "eager_latency_s", "tolerances", "runner"} <= set(entry)


def test_losing_candidates_are_pruned(tmp_path: Path, artifact_backend: ArtifactBackend) -> None:
    fast, slow = ArtifactBackend(tag="fast"), ArtifactBackend(tag="slow", delay_s=10e-3)
    result = tt.tune(
        tiny(),
        data(),
        depth=1,
        strategy=tt.MinLatencyStrategy([slow, fast]),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
    )
    assert {e.backend.tag for e in result.plan.entries} == {"fast"}  # type: ignore[attr-defined]
    manifest = split(tt.save(result, tmp_path / "m.tt")).manifest
    assert [e["backend"]["config"]["tag"] for e in manifest["entries"]] == ["fast", "fast"]
    referenced = {m for e in manifest["entries"] for m in e["members"]}
    assert set(manifest["members"]) == referenced | {"weights.safetensors"}


# --- partial load


def test_partial_load_opens_only_the_plans_members(
    saved: tuple[Path, list[torch.Tensor]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, expected = saved
    # An extra member (listed, with a valid checksum) that no entry of the plan reaches.
    rewrite(path, lambda p: p.set_member("runners/99/unused.bin", b"never read" * 100))
    plan_members = {m for e in split(path).manifest["entries"] for m in e["members"]}
    opened: list[str] = []
    real_open = zipfile.ZipFile.open

    def spy(self: zipfile.ZipFile, name: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(name.filename if isinstance(name, zipfile.ZipInfo) else name)
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    loaded = load_fresh(path)
    assert sorted(opened) == sorted({"manifest.json", "weights.safetensors", *plan_members})
    assert "runners/99/unused.bin" not in opened
    assert_same(outputs(loaded, data(3)), expected)


def test_eager_only_paths_need_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = tune(tiny(), tt.backends.Eager(), 1)
    path = tt.save(result, tmp_path / "eager.tt")
    assert wrapped_paths(load_fresh(path)) == []  # eager winners keep their forward, as after tune


# --- refusals: header


def test_legacy_zip_refused(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.tt"
    with zipfile.ZipFile(legacy, "w") as archive:
        archive.writestr("manifest.json", "{}")
    with pytest.raises(tt.IncompatibleCheckpointError) as err:
        load_fresh(legacy)
    assert "67324752" in str(err.value) and "before" in str(err.value)
    assert "Tune the model again" in str(err.value)


def test_other_version_refused_before_reading_anything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v2.tt"
    # Everything after the version is garbage that any further read would trip over.
    path.write_bytes(struct.pack("<I", 2) + b"\xff" * 64)
    reads: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, f: Any) -> None:
            self.f = f

        def read(self, n: int = -1) -> bytes:
            reads.append(n)
            return self.f.read(n)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.f.close()

        def fileno(self) -> int:
            return self.f.fileno()

    monkeypatch.setattr(
        "builtins.open",
        lambda p, mode="r", *a, **k: (
            Counting(real_open(p, mode, *a, **k))
            if Path(p) == path
            else real_open(p, mode, *a, **k)
        ),
    )
    with pytest.raises(tt.IncompatibleCheckpointError, match="format version 2; this tunetree"):
        load_fresh(path)
    assert reads == [4]


@pytest.mark.parametrize("content", [b"", b"\x01\x00", b"\x01\x00\x00\x00\x10\x00"])
def test_truncated_header(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "short.tt"
    path.write_bytes(content)
    with pytest.raises(tt.CheckpointError, match="truncated"):
        load_fresh(path)


def test_record_length_past_end_of_file(tmp_path: Path) -> None:
    path = tmp_path / "long.tt"
    path.write_bytes(struct.pack("<II", 1, 10_000) + b'{"host": "x"}')
    with pytest.raises(tt.CheckpointError, match="10000 bytes but only 13 bytes follow"):
        load_fresh(path)


def test_invalid_json_record(tmp_path: Path, saved: tuple[Path, list[torch.Tensor]]) -> None:
    path = tmp_path / "bad.tt"
    record = b'{"host": "x", oops'
    path.write_bytes(struct.pack("<II", 1, len(record)) + record + b"PK\x05\x06" + b"\0" * 18)
    with pytest.raises(tt.CheckpointError, match="not valid UTF-8 JSON"):
        load_fresh(path)
    record = b"[1, 2]"
    path.write_bytes(struct.pack("<II", 1, len(record)) + record)
    with pytest.raises(tt.CheckpointError, match="record is malformed"):
        load_fresh(path)


# --- refusals: environment


def test_changed_library_version(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved
    rewrite(path, lambda p: p.record["versions"].update(torch="1.0.0"))
    with pytest.raises(tt.IncompatibleCheckpointError) as err:
        load_fresh(path)
    message = str(err.value)
    assert f"versions.torch: tuned '1.0.0' vs running '{torch.__version__}'" in message
    assert "belong to the hardware and libraries" in message and "Tune again" in message
    assert isinstance(err.value, checkpoint.EnvironmentMismatchError)
    assert [d.entry for d in err.value.differences] == ["versions.torch"]


def test_changed_host_and_explicit_waiver(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, expected = saved
    rewrite(path, lambda p: p.record.update(host="build-box-17"))
    with pytest.raises(tt.IncompatibleCheckpointError, match="host: tuned 'build-box-17'") as err:
        load_fresh(path)
    assert "ignore=('host',)" in str(err.value)
    # ...and how to get the tuned model on this host from the shared tuning cache instead.
    assert "TUNETREE_CACHE_REMOTE=s3://" in str(err.value) and "no build" in str(err.value)
    assert_same(outputs(load_fresh(path, ignore=("host",)), data(3)), expected)
    assert_same(outputs(load_fresh(path, ignore="host"), data(3)), expected)


def test_every_difference_is_listed(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved

    def change(p: Parts) -> None:
        p.record["host"] = "other"
        p.record["cpu"]["flags"] = [*p.record["cpu"]["flags"], "future_isa"]
        p.record["accelerators"]["npu"] = {"count": 8, "names": ["Future NPU"] * 8}
        p.record["versions"]["python"] = "CPython 3.99.0"

    rewrite(path, change)
    with pytest.raises(tt.IncompatibleCheckpointError) as err:
        load_fresh(path)
    message = str(err.value)
    for text in (
        "host: tuned 'other'",
        "cpu.flags: tuned has [future_isa] that running lacks",
        "accelerators.npu.count: tuned 8 vs running (absent)",
        "versions.python: tuned 'CPython 3.99.0'",
    ):
        assert text in message
    # ignore="cpu" waives cpu.flags and everything else below cpu.
    with pytest.raises(tt.IncompatibleCheckpointError) as err:
        load_fresh(path, ignore=("host", "cpu", "versions.python"))
    assert [d.entry for d in err.value.differences] == [  # type: ignore[attr-defined]
        "accelerators.npu.count",
        "accelerators.npu.names",
    ]


def test_record_must_belong_to_the_archive(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved
    rewrite(path, lambda p: p.record.update(host="spliced"), bind=False)
    with pytest.raises(tt.CheckpointError, match="does not belong to this archive"):
        load_fresh(path, ignore=("host",))


def test_other_device_type_refused(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved
    rewrite(path, lambda p: setattr(p, "manifest", {**p.manifest, "device": "cuda:0"}))
    with pytest.raises(tt.IncompatibleCheckpointError, match="tuned on cuda:0"):
        load_fresh(path)


def test_unknown_backend_refused(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved

    def unknown(p: Any) -> None:
        manifest = p.manifest
        for entry in manifest["entries"]:
            entry["backend"]["kind"] = "no-such-backend"
        p.manifest = manifest

    rewrite(path, unknown)
    with pytest.raises(
        tt.IncompatibleCheckpointError, match="'no-such-backend', which this tunetree"
    ):
        load_fresh(path)


# --- refusals: archive


def _artifact_offset(path: Path, name: str) -> int:
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
    raw = path.read_bytes()
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    return info.header_offset + 30 + name_len + extra_len + info.compress_size // 2


def test_flipped_byte_in_artifact(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved
    raw = bytearray(path.read_bytes())
    raw[_artifact_offset(path, "runners/0/blob.bin")] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(tt.CheckpointError, match=r"member .runners/0/blob.bin. is damaged"):
        load_fresh(path)


def test_altered_artifact_fails_its_checksum(saved: tuple[Path, list[torch.Tensor]]) -> None:
    # Re-zipped with valid zip CRCs: only the manifest's SHA-256 can tell.
    path, _ = saved
    rewrite(path, lambda p: p.members.update({"runners/1/blob.bin": b"\x00" * 4096}))
    with pytest.raises(tt.CheckpointError, match=r"'runners/1/blob.bin' fails its checksum"):
        load_fresh(path)


@pytest.mark.parametrize(
    "name", ["../evil", "/abs/evil", "runners\\..\\evil", "C:evil", "a/../../evil"]
)
def test_zip_slip_member_refused(
    saved: tuple[Path, list[torch.Tensor]], tmp_path: Path, name: str
) -> None:
    path, _ = saved

    def add_evil(p: Parts) -> None:
        p.set_member(name, b"owned")
        manifest = p.manifest
        manifest["entries"][0]["members"].append(name)
        p.manifest = manifest

    rewrite(path, add_evil)
    with pytest.raises(tt.CheckpointError, match="outside its directory") as err:
        load_fresh(path)
    assert repr(name) in str(err.value)
    assert not (tmp_path.parent / "evil").exists() and not Path("/abs/evil").exists()
    with pytest.raises(tt.CheckpointError, match="outside its directory"):
        checkpoint.read_info(path)


class Payload:
    """Unpickling this creates a marker file: proof that code from the file ran."""

    marker = ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def _payload(marker: Path) -> bytes:
    Payload.marker = str(marker)
    return pickle.dumps(Payload())


def test_malicious_pickle_never_runs(
    saved: tuple[Path, list[torch.Tensor]], tmp_path: Path
) -> None:
    path, _ = saved
    marker = tmp_path / "payload-ran"

    # 1. A pickle posing as the weights.
    rewrite(path, lambda p: p.set_member("weights.safetensors", _payload(marker)))
    with pytest.raises(tt.CheckpointError, match="weights cannot be read"):
        load_fresh(path)

    # 2. A manifest that asks for pickled (torch.save) weights.
    def torch_weights(p: Parts) -> None:
        p.set_member("weights.pt", _payload(marker))
        manifest = p.manifest
        manifest["weights"] = {"member": "weights.pt", "format": "torch"}
        p.manifest = manifest

    rewrite(path, torch_weights)
    with pytest.raises(tt.CheckpointError, match="safetensors only"):
        load_fresh(path)
    with pytest.raises(tt.CheckpointError, match="safetensors only"):
        checkpoint.read_info(path)
    assert not marker.exists()


def test_pickled_artifact_is_only_data(tmp_path: Path, artifact_backend: ArtifactBackend) -> None:
    result = tune(tiny(), artifact_backend, 1)
    path = tt.save(result, tmp_path / "m.tt")
    marker = tmp_path / "payload-ran"

    def add(p: Parts) -> None:
        p.set_member("runners/0/model.pkl", _payload(marker))
        manifest = p.manifest
        manifest["entries"][0]["members"].append("runners/0/model.pkl")
        p.manifest = manifest

    rewrite(path, add)
    load_fresh(path)
    checkpoint.read_info(path)
    assert not marker.exists()


def test_no_unpickling_in_checkpoint_code() -> None:
    package = ROOT / "tunetree"
    files = [*sorted((package / "checkpoint").glob("*.py")), package / "runtime" / "artifacts.py"]
    for path in [*files, package / "cli.py"]:
        name, source = path.name, path.read_text()
        banned_calls = ("import pickle", "pickle.load", "torch.load(", "weights_only=False")
        for banned in (*banned_calls, "eval(", "exec(", "__reduce__"):
            assert banned not in source, f"{name} contains {banned!r}"


def test_zip_bomb_refused(
    saved: tuple[Path, list[torch.Tensor]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = saved
    zeros = b"\x00" * (8 << 20)  # deflates about 1000x

    def bomb(p: Parts) -> None:
        p.set_member("runners/0/blob.bin", zeros)

    rewrite(path, bomb)
    with pytest.raises(tt.CheckpointError, match="zip bomb"):
        load_fresh(path)
    monkeypatch.setattr(checkpoint_format, "MAX_TOTAL_BYTES", 1000)
    with pytest.raises(tt.CheckpointError, match="over the limit"):
        load_fresh(path)


def test_declared_size_must_match_manifest(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved

    def lie(p: Parts) -> None:
        manifest = p.manifest
        manifest["members"]["runners/0/blob.bin"]["size"] = 10
        p.manifest = manifest

    rewrite(path, lie)
    with pytest.raises(tt.CheckpointError, match="but the manifest says 10"):
        load_fresh(path)


def test_truncated_archive(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(tt.CheckpointError, match="truncated or damaged"):
        load_fresh(path)


def test_weights_must_fit_the_model(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved
    with pytest.raises(tt.CheckpointError, match=r"body.0.weight: saved torch.float32\[32, 16\]"):
        tt.load(tiny(width=8), path)
    with pytest.raises(tt.CheckpointError, match="missing from the checkpoint"):
        tt.load(nn.Sequential(Tiny(), nn.Linear(4, 4)), path)


def test_load_needs_an_untuned_model(saved: tuple[Path, list[torch.Tensor]]) -> None:
    path, _ = saved
    tuned = load_fresh(path)
    with pytest.raises(tt.InvalidInputError, match="freshly built"):
        tt.load(tuned, path)


# --- atomic save


def test_failed_rename_keeps_old_checkpoint(
    saved: tuple[Path, list[torch.Tensor]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, expected = saved
    before = path.read_bytes()

    def fail(*args: Any) -> None:
        raise OSError("disk vanished")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(writer.os, "replace", fail)
        with pytest.raises(OSError, match="disk vanished"):
            tt.save(tiny(seed=9), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.tt"]
    assert_same(outputs(load_fresh(path), data(3)), expected)


def test_failed_directory_swap_keeps_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "ckpt"
    tt.save(tiny(), target, compress_checkpoint=False)

    def fail(*args: Any) -> None:
        raise OSError("rename failed")

    from tunetree.checkpoint import staging

    monkeypatch.setattr(staging, "exchange", lambda a, b: False)  # rename aside, not swap
    monkeypatch.setattr(writer.os, "rename", fail)
    with pytest.raises(OSError, match="rename failed"):
        tt.save(tiny(seed=4), target, compress_checkpoint=False)
    monkeypatch.undo()
    assert_same(outputs(tt.load(tiny(seed=8), target), data()), outputs(tiny(), data()))


def test_save_killed_before_rename_keeps_old_checkpoint(
    saved: tuple[Path, list[torch.Tensor]],
) -> None:
    path, expected = saved
    before = path.read_bytes()
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        import tunetree as tt
        from tunetree.checkpoint import writer
        from tests.checkpoint.test_checkpoint import tiny

        def killed(tmp, target):
            assert tmp.stat().st_size > 0  # written and fsynced: die before the rename
            os.kill(os.getpid(), signal.SIGKILL)

        writer.install = killed
        tt.save(tiny(seed=5), {str(path)!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert path.read_bytes() == before
    leftovers = [p.name for p in path.parent.iterdir() if p.name != "model.tt"]
    assert leftovers and all(".tmp-" in n for n in leftovers)  # the killed writer's temp files
    assert_same(outputs(load_fresh(path), data(3)), expected)


def test_pipeline_of_modules(tmp_path: Path, artifact_backend: ArtifactBackend) -> None:
    class Pipeline:
        def __init__(self, seed: int) -> None:
            torch.manual_seed(seed)
            self.encoder = nn.Linear(16, 8).eval()
            self.decoder = nn.Linear(8, 4).eval()

    def call(p: Pipeline, x: torch.Tensor) -> torch.Tensor:
        return p.decoder(torch.relu(p.encoder(x)))

    result = tt.tune(
        Pipeline(0),
        data(),
        depth=0,
        call=call,
        strategy=tt.OneBackendStrategy(artifact_backend),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
    )
    path = tt.save(result, tmp_path / "pipe.tt")
    loaded = tt.load(Pipeline(3), path)
    with torch.no_grad():
        assert_same([call(loaded, x) for x in data()], [call(result.model, x) for x in data()])


# --- ranges (issue 12)


def test_ranges_survive_save_load_and_serve_unrecorded_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.cache.fakes import Saving
    from tunetree.cli import main
    from tunetree.runtime.wrap import dispatcher_of

    g = torch.Generator().manual_seed(5)
    dataset = [torch.randn(b, 16, generator=g) for b in (2, 4, 8)]
    model = tiny()
    result = tune(model, Saving(), 0, dataset)
    assert str(result.graphs[0].graph.key) == "(f32[batch 2..8, 16])"
    path = tt.save(result, tmp_path / "ranged.tt")
    (row,) = checkpoint.read_info(path).plan_rows()
    assert row["graph"] == "(f32[batch 2..8, 16])"
    assert main(["info", str(path)]) == 0
    assert "f32[batch 2..8, 16]" in capsys.readouterr().out
    loaded = tt.load(tiny(seed=7), path)
    (key,) = dispatcher_of(loaded).runners
    assert key.dims() == {"batch": tt.Dim("batch", 2, 8)}
    x = torch.randn(5, 16, generator=g)  # a batch size never recorded, inside the range
    runner = dispatcher_of(loaded).route(GraphKey.of((x,), {}))
    assert runner is not None and runner.backend.kind == "test-saving"
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
