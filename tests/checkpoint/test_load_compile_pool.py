"""tt.load leaves no compile work behind: a runner it rebuilds may compile lazily on its check
call (an Inductor runner does, in Inductor's pool of non-daemon threads). Like tuning, the load
shuts down a pool made meanwhile, with the compiles still queued there cancelled, so that none
runs on after it, and none at the process's exit, whether the load succeeded or refused."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import mlp
from tunetree.backends.base import Backend, Runner
from tunetree.backends.compile_pool import close_compile_pool, compile_pool_made
from tunetree.signature.binding import original_forward
from tunetree.signature.graph import Graph, GraphKey

async_compile = pytest.importorskip("torch._inductor.async_compile")

RAN: list[int] = []
LOCK = threading.Lock()


def _kernel(seconds: float) -> None:
    time.sleep(seconds)
    with LOCK:
        RAN.append(1)


class LazyRunner(Runner):
    """Runs the module; a loaded one compiles on its first call, in Inductor's pool."""

    def __init__(self, backend: Backend, module: nn.Module, lazy: bool) -> None:
        super().__init__(backend)
        self.forward = original_forward(module)
        self.lazy = lazy

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.lazy:
            self.lazy = False
            assert isinstance(self.backend, CompilesOnLoad)
            pool = async_compile.AsyncCompile.pool()
            futures = [pool.submit(_kernel, 0.2) for _ in range(30)]
            futures[0].result()
            if self.backend.fails:
                raise RuntimeError("lowering failed")
            for future in futures:
                future.result()
        return self.forward(*args, **kwargs)

    def save(self, directory: Path) -> dict[str, Any]:
        return {}


@dataclasses.dataclass(frozen=True)
class CompilesOnLoad(Backend):
    kind: ClassVar[str] = "test-compiles-on-load"
    fails: bool = False

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        return LazyRunner(self, module, lazy=False)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        description: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        return LazyRunner(self, module, lazy=True)


@pytest.fixture
def two_compile_threads() -> Iterator[None]:
    close_compile_pool()  # one an earlier test's own compile left is not the load's
    RAN.clear()
    with torch._inductor.config.patch(compile_threads=2):
        yield


def _saved(backend: CompilesOnLoad, tmp_path: Path) -> Path:
    result = tt.tune(
        mlp(),
        [torch.randn(4, 16)],
        strategy=tt.OneBackendStrategy(backend),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    assert result.plan.runners(), str(result)
    return tt.save(result, tmp_path / "model.tt")


@pytest.mark.usefixtures("two_compile_threads")
def test_a_load_whose_runner_compiled_leaves_no_pool(tmp_path: Path) -> None:
    path = _saved(CompilesOnLoad(), tmp_path)
    assert not compile_pool_made()
    loaded = tt.load(mlp(), path)
    assert len(RAN) == 30  # the runner's compile ran, in the pool
    assert not compile_pool_made()
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), mlp()(x))


@pytest.mark.usefixtures("two_compile_threads")
def test_a_refused_load_leaves_no_queued_compile(tmp_path: Path) -> None:
    path = _saved(CompilesOnLoad(fails=True), tmp_path)
    with pytest.raises(tt.TunetreeError, match="lowering failed"):
        tt.load(mlp(), path)
    assert not compile_pool_made()
    time.sleep(1.0)
    ran = len(RAN)
    assert ran < 10  # the 30 queued were cancelled; the running ones finished
    time.sleep(1.0)
    assert len(RAN) == ran
