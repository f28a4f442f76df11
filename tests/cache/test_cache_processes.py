"""The tuning cache across real processes: restarts, edited source, killed writers, races.

Each step runs ``python -m tests.cache.fakes CONFIG`` (see tests/cache/fakes.py) in a new
interpreter with ``TUNETREE_CACHE_DIR`` set, and reads back which backend builds it made.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tunetree.cache import KILL_HOOK_ENV, KILL_POINTS, TuningCache
from tunetree.cache.store import CacheStore

ROOT = Path(__file__).resolve().parents[2]


def _command(config: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "tests.cache.fakes", json.dumps(config)]


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != KILL_HOOK_ENV}
    env["TUNETREE_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def fresh(cache: Path, config: dict[str, Any], **extra: str) -> dict[str, Any]:
    """Tune in a new process; its report (builds, hits, misses, ok)."""
    done = subprocess.run(
        _command(config),
        env=_env(cache, **extra),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_second_tune_in_a_fresh_process_builds_nothing(tmp_path: Path) -> None:
    config = {"depths": [0, 1, 2]}
    first = fresh(tmp_path, config)
    assert first["ok"] and len(first["builds"]) == 5  # root, a, b, a.lin, b.lin
    second = fresh(tmp_path, config)
    assert second == {"builds": [], "hits": 5, "misses": 0, "ok": True}


@pytest.mark.slow
def test_inductor_runner_comes_back_from_the_cache(tmp_path: Path) -> None:
    config = {"depths": [0], "strategy": "inductor"}
    first = fresh(tmp_path, config)
    assert first["ok"] and first["builds"] == ["inductor:"]
    second = fresh(tmp_path, config)
    assert second == {"builds": [], "hits": 1, "misses": 0, "ok": True}


EDITABLE = """
import torch
from torch import nn


def scale(x):
    return x * {factor}


class Inner(nn.Module):
    def forward(self, x):
        return scale(torch.relu(x))


class Mid(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(self.inner(x))


class Side(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Root(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = Side()
        self.mid = Mid()

    def forward(self, x):
        return self.mid(self.side(x))
"""


def test_editing_a_submodule_retunes_it_and_its_ancestors_only(tmp_path: Path) -> None:
    source = tmp_path / "model_source.py"
    config = {"model": f"file:{source}", "depths": [0, 1, 2], "cache": str(tmp_path / "c")}

    source.write_text(EDITABLE.format(factor="2.0"))
    first = fresh(tmp_path, config)
    paths = ["", "side", "mid", "side.lin", "mid.inner", "mid.lin"]
    assert first["ok"] and sorted(first["builds"]) == sorted(f"test-saving:{p}" for p in paths)

    # Edit a helper that only mid.inner calls: it, mid and the root are tuned again.
    source.write_text(EDITABLE.format(factor="3.0"))
    edited = fresh(tmp_path, config)
    assert edited["ok"]
    assert sorted(edited["builds"]) == ["test-saving:", "test-saving:mid", "test-saving:mid.inner"]

    # Reverting the edit reuses the old entries.
    source.write_text(EDITABLE.format(factor="2.0"))
    reverted = fresh(tmp_path, config)
    assert reverted["ok"] and reverted["builds"] == [] and reverted["hits"] == 6


@pytest.mark.parametrize("step", KILL_POINTS)
def test_writer_killed_at_each_step(tmp_path: Path, step: str) -> None:
    config = {"depths": [0], "seed": 5}
    done = subprocess.run(
        _command(config),
        env=_env(tmp_path, **{KILL_HOOK_ENV: step}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    store = CacheStore(tmp_path)
    assert store.entry_keys() == [] and list(store.tmp.iterdir())  # an orphan is left
    orphan_artifacts = {p.name for p in store.artifacts.glob("*/*")}
    assert orphan_artifacts  # every step comes after the first artifact

    # The next run (other weights, so other artifact contents) re-tunes and works.
    after = fresh(tmp_path, {"depths": [0], "seed": 6})
    assert after["ok"] and after["builds"] == ["test-saving:"]

    # gc removes the dead writer's staging directory and every artifact only it placed.
    report = TuningCache(tmp_path).gc()
    assert report.temporaries == 1 and list(store.tmp.iterdir()) == []
    kept = {p.name for p in store.artifacts.glob("*/*")}
    referenced = {sha for info in TuningCache(tmp_path).entries() for sha in info.artifacts}
    assert kept == referenced and report.artifacts == len(orphan_artifacts - referenced)
    assert TuningCache(tmp_path).verify() == []


def test_two_processes_started_together_converge(tmp_path: Path) -> None:
    # A slow build makes the two processes overlap on every graph.
    config = {"depths": [0, 1], "build_delay_s": 0.3}
    procs = [
        subprocess.Popen(
            _command(config),
            env=_env(tmp_path),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in reports)
    cache = TuningCache(tmp_path)
    entries = cache.entries()
    assert len(entries) == 3 and {e.path for e in entries} == {"", "a", "b"}
    assert cache.verify() == []
    # The per-key lock let each graph be tuned once in all.
    builds = sorted(b for r in reports for b in r["builds"])
    assert builds == ["test-saving:", "test-saving:a", "test-saving:b"]
    assert sum(r["hits"] for r in reports) == 3
