"""DeviceGraph: availability and signature rebuilding everywhere; capture and replay on a GPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tunetree.backends import (
    DeviceGraph,
    Eager,
    Inductor,
    backend_type,
    default_backends,
    device_graph,
)
from tunetree.backends.graph_api import GraphApi
from tunetree.backends.registry import BUILTIN_BACKENDS
from tunetree.errors import BackendError, InvalidInputError
from tunetree.signature.compare import Tolerances, compare_all
from tunetree.signature.graph import Graph, Sample, flatten

from .export_models import graph_of

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


# --------------------------------------------------------------------------- everywhere


def test_unavailable_on_cpu() -> None:
    assert DeviceGraph().unavailable_reason(torch.device("cpu")) == (
        "device graphs need a CUDA or XPU device"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given without CUDA")
def test_unavailable_without_cuda() -> None:
    reason = DeviceGraph().unavailable_reason(CUDA)
    assert reason is not None and "CUDA is not available" in reason


def test_build_on_cpu_fails_with_backend_error() -> None:
    module = nn.Linear(4, 4).eval()
    x = torch.randn(2, 4)
    graph = Graph(key=Sample((x,)).key, samples=[Sample((x,))], outputs=[module(x)])
    with pytest.raises(BackendError, match="CUDA or XPU"):
        DeviceGraph().build(module, graph, torch.device("cpu"))


def test_config_and_registration() -> None:
    assert DeviceGraph in BUILTIN_BACKENDS and backend_type("device-graph") is DeviceGraph
    assert DeviceGraph.preserves_results
    backend = DeviceGraph(clone_outputs=False)
    assert backend.name == "device-graph(clone_outputs=False)"
    assert DeviceGraph(**backend.config()) == backend
    with pytest.raises(InvalidInputError, match="nested"):
        DeviceGraph(compile=True, compile_mode="reduce-overhead")


def test_decode_only_refuses_graphs_without_a_cache_before_capturing() -> None:
    module = nn.Linear(4, 4).eval()
    x = torch.randn(2, 4)
    graph = Graph(key=Sample((x,)).key, samples=[Sample((x,))], outputs=[module(x)])
    with pytest.raises(BackendError, match="decode steps"):
        DeviceGraph(compile=True, decode_only=True).build(module, graph, torch.device("cpu"))


def test_default_backends_order() -> None:
    cuda = default_backends(CUDA)
    assert cuda[:3] == [Inductor(), Inductor(mode="reduce-overhead"), DeviceGraph()]
    # decode steps (refused by Inductor) get Inductor's code captured on the static cache
    assert cuda[3] == DeviceGraph(compile=True, compile_mode=None, decode_only=True)
    assert cuda[-1] == Eager()
    xpu = default_backends(torch.device("xpu"))
    assert xpu[:2] == [Inductor(), DeviceGraph()] and xpu[-1] == Eager()
    assert DeviceGraph() not in default_backends(torch.device("cpu"))


# ------------------------------------------------- the runner's plumbing on CPU, with a fake graph


class _FakeGraph:
    """Stands in for ``torch.cuda.CUDAGraph`` on CPU: capture records the call, and replay runs
    it again and writes the results into the captured output tensors, as a real replay does."""

    recording: _FakeGraph | None = None

    def __init__(self) -> None:
        self.call: tuple[Any, tuple[Any, ...], dict[str, Any], Any] | None = None
        self.pool: Any = None

    def replay(self) -> None:
        assert self.call is not None
        forward, args, kwargs, out = self.call
        for static, new in zip(_tensors(out), _tensors(forward(*args, **kwargs)), strict=True):
            static.copy_(new)


class _FakeStream:
    def wait_stream(self, other: Any) -> None:
        pass


@contextmanager
def _fake_capture(graph: _FakeGraph, pool: Any = None) -> Iterator[None]:
    graph.pool = pool
    _FakeGraph.recording = graph
    try:
        yield
    finally:
        _FakeGraph.recording = None


@pytest.fixture
def fake_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    api = GraphApi(
        graph=_FakeGraph,
        capture=_fake_capture,
        stream=_FakeStream,
        use_stream=lambda stream: nullcontext(),
        current_stream=_FakeStream,
        device_guard=lambda device: nullcontext(),
        pool_handle=object,
    )
    real_forward = device_graph.original_forward

    def recording_forward(module: nn.Module) -> Any:
        forward = real_forward(module)

        def call(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            if _FakeGraph.recording is not None:
                _FakeGraph.recording.call = (forward, args, kwargs, out)
            return out

        return call

    monkeypatch.setattr(device_graph, "graph_api", lambda device: api)
    monkeypatch.setattr(device_graph, "original_forward", recording_forward)


class _KwargModel(nn.Module):
    """Keyword tensor inputs, a constant, and a dict output: the Hugging Face shape of things."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.proj = nn.Linear(8, 4)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, scale: float = 1.0
    ) -> dict[str, torch.Tensor]:
        hidden = self.proj(self.embed(input_ids)) * attention_mask[..., None] * scale
        return {"hidden": hidden, "pooled": hidden.mean(1)}


def _kwarg_samples() -> list[Sample]:
    return [
        Sample(
            (),
            {
                "input_ids": torch.randint(0, 10, (2, 5)),
                "attention_mask": torch.ones(2, 5),
                "scale": 2.0,
            },
        )
        for _ in range(2)
    ]


@pytest.mark.usefixtures("fake_graphs")
def test_replay_plumbing_with_keyword_inputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = _KwargModel().eval()
    samples = _kwarg_samples()
    graph = graph_of(module, samples)
    backend = DeviceGraph()
    runner = backend.build(module, graph, CPU)
    outputs = _run_all(runner, samples)
    assert compare_all(graph.outputs, outputs, Tolerances()).ok
    # Outputs are clones: a later call leaves an earlier result alone.
    assert not torch.equal(outputs[0]["hidden"], outputs[1]["hidden"])
    assert compare_all(graph.outputs[:1], outputs[:1], Tolerances()).ok
    # Keyword order does not matter; a sample rebuilt from the key has them sorted.
    swapped = {k: samples[1].kwargs[k] for k in reversed(list(samples[1].kwargs))}
    with torch.no_grad():
        assert compare_all(graph.outputs[1:], [runner(**swapped)]).ok
    loaded = backend.load(module, graph.key, tmp_path, runner.save(tmp_path), CPU)
    assert compare_all(graph.outputs, _run_all(loaded, samples), Tolerances()).ok
    with pytest.raises(BackendError, match="static shapes"):
        runner(
            input_ids=torch.zeros(3, 5, dtype=torch.int64),
            attention_mask=torch.ones(3, 5),
            scale=2.0,
        )


@pytest.mark.usefixtures("fake_graphs")
def test_replay_plumbing_with_nested_inputs() -> None:
    module = nn.Bilinear(3, 4, 2).eval()

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return self.inner(*pair)

    pair_module = Pair().eval()
    samples = [Sample(((torch.randn(5, 3), torch.randn(5, 4)),)) for _ in range(2)]
    graph = graph_of(pair_module, samples)
    runner = DeviceGraph(clone_outputs=False).build(pair_module, graph, CPU)
    assert runner.top_slots is None  # nested: the general path
    with torch.no_grad():
        first = runner(*samples[0].args)
        second = runner(*samples[1].args)
    assert first is second  # without clones the next replay overwrites
    assert compare_all(graph.outputs[1:], [second]).ok
    with pytest.raises(BackendError, match="structured differently"):
        runner(samples[0].args[0][0])


# --------------------------------------------------------------------------- on a GPU


@pytest.fixture
def no_tf32() -> Iterator[None]:
    """Eager and the graph run the same kernels; TF32 off keeps the reference exact fp32."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _mlp() -> tuple[nn.Module, list[Sample]]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    module = nn.Sequential(*layers[:-1]).eval().to(CUDA)
    return module, [Sample((torch.randn(32, 1024, device=CUDA),)) for _ in range(2)]


def _encoder() -> tuple[nn.Module, list[Sample]]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(256, 8, dim_feedforward=1024, batch_first=True)
    module = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval().to(CUDA)
    return module, [Sample((torch.randn(8, 128, 256, device=CUDA),)) for _ in range(2)]


def _bert() -> tuple[nn.Module, list[Sample]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=256,
    )
    module = transformers.BertModel(config).eval().to(CUDA)
    samples = []
    for pad in (0, 17):  # one sample without padding, one with
        ids = torch.randint(0, 1000, (8, 128), device=CUDA)
        mask = torch.ones(8, 128, dtype=torch.int64, device=CUDA)
        mask[:, 128 - pad :] = 0
        samples.append(Sample((), {"input_ids": ids, "attention_mask": mask}))
    return module, samples


MODELS = {"mlp": _mlp, "encoder": _encoder, "bert": _bert}


def _run_all(runner: Any, samples: list[Sample]) -> list[Any]:
    with torch.no_grad():
        return [runner(*s.args, **s.kwargs) for s in samples]


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in flatten(tree)[0] if isinstance(x, torch.Tensor)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.usefixtures("no_tf32")
@pytest.mark.parametrize("model", sorted(MODELS))
def test_matches_eager_and_round_trips(model: str, tmp_path: Path) -> None:
    module, samples = MODELS[model]()
    graph = graph_of(module, samples)
    backend = DeviceGraph()
    assert backend.unavailable_reason(CUDA) is None
    runner = backend.build(module, graph, CUDA)

    outputs = _run_all(runner, samples)
    result = compare_all(graph.outputs, outputs, Tolerances())
    assert result.ok, result.reason
    assert type(outputs[0]) is type(graph.outputs[0])

    # Outputs are clones: the second call (other data) leaves the first result alone.
    first = _run_all(runner, samples[:1])[0]
    kept = [t.clone() for t in _tensors(first)]
    _run_all(runner, samples[1:])
    assert all(torch.equal(a, b) for a, b in zip(kept, _tensors(first), strict=True))

    # Save writes nothing but its record; load captures again from placeholder inputs.
    saved_record = runner.save(tmp_path)
    assert not any(tmp_path.iterdir())
    loaded = backend.load(module, graph.key, tmp_path, saved_record, CUDA)
    result = compare_all(graph.outputs, _run_all(loaded, samples), Tolerances())
    assert result.ok, result.reason


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.usefixtures("no_tf32")
def test_without_clones_the_next_replay_overwrites() -> None:
    module, samples = _mlp()
    graph = graph_of(module, samples)
    runner = DeviceGraph(clone_outputs=False).build(module, graph, CUDA)
    with torch.no_grad():
        first = runner(*samples[0].args)
        second = runner(*samples[1].args)
    assert first.data_ptr() == second.data_ptr()
    assert compare_all(graph.outputs[1:], [first]).ok


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_other_shape_is_refused() -> None:
    module, samples = _mlp()
    runner = DeviceGraph().build(module, graph_of(module, samples), CUDA)
    with pytest.raises(BackendError, match="static shapes"):
        runner(torch.randn(16, 1024, device=CUDA))


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.usefixtures("no_tf32")
def test_captures_the_compiled_forward() -> None:
    module, samples = _encoder()
    graph = graph_of(module, samples)
    backend = DeviceGraph(compile=True, compile_mode=None)
    assert backend.unavailable_reason(CUDA) is None
    runner = backend.build(module, graph, CUDA)
    result = compare_all(graph.outputs, _run_all(runner, samples), Tolerances())
    assert result.ok, result.reason


# ------------------------------------------------------------- ranged graphs: a set of captures


def _ranged_mlp(device: torch.device, batches: tuple[int, ...]) -> tuple[nn.Module, Graph]:
    from tunetree.signature.shapes import group_graphs

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval().to(device)
    samples = [Sample((torch.randn(b, 8, device=device),)) for b in batches]
    with torch.no_grad():
        (graph,) = group_graphs([(s, module(*s.args)) for s in samples]).values()
    assert graph.key.is_dynamic
    return module, graph


def _check_shape_set(module: nn.Module, graph: Graph, device: torch.device, tmp: Path) -> None:
    backend = DeviceGraph(max_shapes=3)
    runner = backend.build(module, graph, device)
    assert isinstance(runner, device_graph.ShapeSetRunner)
    assert runner.served_shapes == [((1, 8),), ((4, 8),)]  # the recorded shapes, at build
    calls = [torch.randn(b, 8, device=device) for b in (4, 7, 1, 5, 7)]
    with torch.no_grad():
        got = [runner(x) for x in calls]
        want = [module(x) for x in calls]
    assert compare_all(want, got, Tolerances()).ok
    # 7 was captured on its first call; 5 found no room and ran eager.
    assert runner.served_shapes == [((1, 8),), ((4, 8),), ((7, 8),)]
    assert runner.eager_calls == 1
    assert "3 of at most 3 shapes captured" in str(runner) and "[7,8]" in str(runner)
    loaded = backend.load(module, graph.key, tmp, runner.save(tmp), device)
    with torch.no_grad():
        assert compare_all(want, [loaded(x) for x in calls], Tolerances()).ok
    assert isinstance(loaded, device_graph.ShapeSetRunner)
    assert loaded.served_shapes == [((4, 8),), ((7, 8),), ((1, 8),)]  # captured on demand
    assert loaded.eager_calls == 1


@pytest.mark.usefixtures("fake_graphs")
def test_ranged_graph_captures_a_bounded_set_of_shapes(tmp_path: Path) -> None:
    module, graph = _ranged_mlp(CPU, (1, 4))
    _check_shape_set(module, graph, CPU, tmp_path)


@pytest.mark.usefixtures("fake_graphs")
def test_captures_made_for_probes_are_dropped_when_the_checks_end() -> None:
    """Each capture holds a copy of its inputs (a decode step's whole cache): those of tuning's
    probes held 0.69 GiB of Llama-0.5B's peak on the H200. Once the checks end only the recorded
    shapes stay captured; a served call of a probe's shape captures it again."""
    module, graph = _ranged_mlp(CPU, (1, 4))
    runner = DeviceGraph(max_shapes=4).build(module, graph, CUDA)
    assert isinstance(runner, device_graph.ShapeSetRunner)
    probe = torch.randn(7, 8)
    with torch.no_grad():
        runner(probe)
        assert runner.served_shapes == [((1, 8),), ((4, 8),), ((7, 8),)]
        runner.end_checks()
        assert runner.served_shapes == [((1, 8),), ((4, 8),)]
        again = runner(probe)
        assert torch.equal(again, module(probe))
    assert runner.served_shapes == [((1, 8),), ((4, 8),), ((7, 8),)] and runner.eager_calls == 0
    # A loaded runner has no recorded shape: it keeps its captures (and so its pool).
    loaded = DeviceGraph(max_shapes=4).load(module, graph.key, Path("."), {}, CUDA)
    assert isinstance(loaded, device_graph.ShapeSetRunner)
    with torch.no_grad():
        loaded(probe)
    loaded.end_checks()
    assert loaded.served_shapes == [((7, 8),)]


@pytest.mark.usefixtures("fake_graphs")
def test_the_captures_of_a_ranged_graph_share_one_memory_pool() -> None:
    module, graph = _ranged_mlp(CPU, (1, 4))
    shared = DeviceGraph(max_shapes=3).build(module, graph, CUDA)
    assert isinstance(shared, device_graph.ShapeSetRunner)
    with torch.no_grad():
        shared(torch.randn(7, 8))  # a third shape, captured on its first call
    pools = {id(capture.graph.pool) for capture in shared.captures.values()}
    assert len(shared.captures) == 3 and len(pools) == 1 and shared.pool is not None
    # Without clones the caller keeps outputs that live in the pool: each capture keeps its own.
    own = DeviceGraph(max_shapes=3, clone_outputs=False).build(module, graph, CUDA)
    assert isinstance(own, device_graph.ShapeSetRunner)
    assert [capture.graph.pool for capture in own.captures.values()] == [None, None]


@pytest.mark.usefixtures("fake_graphs")
def test_every_capture_warms_up_and_captures_with_blas_workspaces_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cuBLAS keeps a workspace per stream: dropped before the warm-ups, between them and the
    capture, and after it, none of a side stream outlives its warm-ups and the capture's lives
    in its own pool (tuning Mistral-8L on the H200 held ten 32 MiB blocks from warm-ups at its
    peak, and later one held through a capture)."""
    events: list[str] = []

    @contextmanager
    def capture(graph: _FakeGraph, pool: Any = None) -> Iterator[None]:
        events.append("capture")
        with _fake_capture(graph, pool):
            yield

    api = dataclasses.replace(
        device_graph.graph_api(CUDA),
        capture=capture,
        clear_workspaces=lambda: events.append("clear"),
    )
    monkeypatch.setattr(device_graph, "graph_api", lambda device: api)
    module, graph = _ranged_mlp(CPU, (1, 4))
    runner = DeviceGraph(max_shapes=3).build(module, graph, CUDA)
    assert events == ["clear", "clear", "capture", "clear"] * 2  # one per recorded shape
    with torch.no_grad():
        runner(torch.randn(7, 8))  # a new shape, captured on its first call
        runner(torch.randn(7, 8))  # replayed: nothing dropped per call
    assert events == ["clear", "clear", "capture", "clear"] * 3


def test_max_shapes_must_be_positive() -> None:
    with pytest.raises(InvalidInputError, match="max_shapes"):
        DeviceGraph(max_shapes=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.usefixtures("no_tf32")
def test_ranged_graph_on_cuda(tmp_path: Path) -> None:
    module, graph = _ranged_mlp(CUDA, (1, 4))
    _check_shape_set(module, graph, CUDA, tmp_path)
