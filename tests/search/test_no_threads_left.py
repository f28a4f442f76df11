"""No compile work outlives tuning: Inductor compiles kernels in a pool of non-daemon threads, and
Python runs every item still queued there before the process exits. A build stopped by the time
budget (or failed) while its kernels were queued must not leave them to run on, during the
measurements that follow and at exit (a process that had finished tuning did not exit)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import tunetree as tt
from tests.fakes import mlp
from tunetree.backends.compile_pool import close_compile_pool, compile_pool_made

async_compile = pytest.importorskip("torch._inductor.async_compile")

ROOT = Path(__file__).resolve().parents[2]

QUEUES = textwrap.dedent(
    """
    import dataclasses, threading, time
    from typing import ClassVar
    import torch
    import torch._inductor.config
    from torch._inductor.async_compile import AsyncCompile
    from tunetree.backends.base import Backend

    torch._inductor.config.compile_threads = 2
    RAN = []
    LOCK = threading.Lock()

    def kernel(seconds):
        time.sleep(seconds)
        with LOCK:
            RAN.append(1)

    @dataclasses.dataclass(frozen=True)
    class QueuesKernels(Backend):
        '''Queues kernel compiles in Inductor's pool and waits for them, then fails (or is
        stopped by the budget while waiting), as an Inductor build does.'''

        kind: ClassVar[str] = "fake-queues-kernels"
        kernels: int = 40
        seconds: float = 0.5

        def build(self, module, graph, device):
            pool = AsyncCompile.pool()
            futures = [pool.submit(kernel, self.seconds) for _ in range(self.kernels)]
            futures[0].result()
            raise RuntimeError("lowering failed")
    """
)


def test_a_failed_build_leaves_no_queued_compile_and_no_pool(tmp_path: Path) -> None:
    namespace: dict = {}
    exec(compile(QUEUES, "queues", "exec"), namespace)
    backend = namespace["QueuesKernels"](kernels=30, seconds=0.2)
    close_compile_pool()  # a pool an earlier test's own compile made (outside tuning) is not ours
    assert not compile_pool_made()
    result = tt.tune(
        mlp(),
        [torch.randn(4, 16)],
        strategy=tt.OneBackendStrategy(backend),
        verbose=False,
        cache=False,
    )
    assert result.graphs[0].rows[0].reason == "build: RuntimeError: lowering failed"
    assert not compile_pool_made()  # the pool made while tuning is shut down
    time.sleep(1.0)
    ran = len(namespace["RAN"])
    assert ran < 10  # the queued 30 were cancelled; the running ones finished
    time.sleep(1.0)
    assert len(namespace["RAN"]) == ran


CHILD = QUEUES + textwrap.dedent(
    """
    import atexit, json, sys
    import tunetree as tt
    from tests.fakes import mlp

    report = {}
    atexit.register(lambda: print("RAN " + json.dumps({"ran": len(RAN)}), flush=True))

    class Stopped(QueuesKernels):
        def build(self, module, graph, device):
            pool = AsyncCompile.pool()
            futures = [pool.submit(kernel, self.seconds) for _ in range(self.kernels)]
            for future in futures:  # the budget stops the build while it waits here
                future.result()
            raise RuntimeError("not stopped")

    result = tt.auto_tune(
        mlp(),
        [torch.randn(4, 16)],
        max_depth=0,
        time_budget=float(sys.argv[1]),
        strategy=tt.HighestThroughputStrategy([Stopped(60, 0.5), tt.backends.Eager()]),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    rows = [row.reason for g in result.graphs[0] for row in g.rows]
    at = {"rows": rows, "ran": len(RAN), "time": time.time()}
    print("RETURNED " + json.dumps(at), flush=True)
    """
)


def test_a_process_whose_build_the_budget_stopped_exits_promptly(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    done = subprocess.run(
        [sys.executable, str(script), "6"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    exited = time.time()
    assert done.returncode == 0, done.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    returned, at_exit = json.loads(said["RETURNED"]), json.loads(said["RAN"])
    assert "time budget used up" in returned["rows"]  # the build was stopped
    # 60 kernels of 0.5 s on 2 threads were queued: 15 s of work left at the stop without the fix.
    assert at_exit["ran"] - returned["ran"] <= 4, done.stdout
    assert exited - returned["time"] < 30
