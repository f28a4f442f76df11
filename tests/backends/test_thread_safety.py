"""Runners called from several threads at once (a web server's worker threads): the ones
that share state serialise, and nothing process-wide is left changed."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from tunetree.backends.tf32 import tf32_allowed


def _flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_overlapping_tf32_blocks_put_the_process_flags_back() -> None:
    """Thread A allows TF32, thread B enters while A is inside, A leaves, B leaves: before,
    B restored the flags it found switched on by A, leaving them on for the whole process."""
    before = _flags()
    a_inside, b_started, a_left = threading.Event(), threading.Event(), threading.Event()

    def a() -> None:
        with tf32_allowed():
            a_inside.set()
            b_started.wait(5)
            time.sleep(0.2)  # B tries to enter meanwhile
        a_left.set()

    def b() -> None:
        a_inside.wait(5)
        b_started.set()
        with tf32_allowed():
            a_left.wait(5)  # still inside when A leaves (when B could enter beside A)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert _flags() == before


def test_onnxruntime_runner_serves_concurrent_calls_as_eager() -> None:
    """ONNX Runtime's session runs calls from several threads at once (its run is
    thread-safe); every thread gets its own call's outputs."""
    pytest.importorskip("onnxruntime")
    import tunetree as tt

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)).eval()
    result = tt.tune(
        model,
        [torch.randn(2, 16), torch.randn(6, 16)],
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    assert result.graphs[0].winner.backend.name == "onnxruntime"
    inputs = [torch.randn(1 + i % 6, 16) for i in range(64)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    got: list[torch.Tensor | None] = [None] * len(inputs)

    def work(start: int) -> None:
        with torch.no_grad():
            for i in range(start, len(inputs), 8):
                got[i] = result.model(inputs[i])

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for e, g in zip(expected, got, strict=True):
        assert g is not None
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_device_graph_replays_from_several_threads_do_not_mix_their_inputs() -> None:
    """A captured graph has one set of static input and output buffers: two threads that
    copied in and replayed at once got each other's outputs. Replays are serialised."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import tunetree as tt

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda().eval()
    result = tt.tune(
        model,
        [torch.randn(8, 256, device="cuda")],
        strategy=tt.OneBackendStrategy(tt.backends.DeviceGraph()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    assert result.graphs[0].winner.backend.kind == "device_graph"
    inputs = [torch.randn(8, 256, device="cuda") for _ in range(400)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    got: list[torch.Tensor | None] = [None] * len(inputs)

    def work(start: int) -> None:
        with torch.no_grad():
            for i in range(start, len(inputs), 8):
                got[i] = result.model(inputs[i])

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    torch.cuda.synchronize()
    for e, g in zip(expected, got, strict=True):
        assert g is not None
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
