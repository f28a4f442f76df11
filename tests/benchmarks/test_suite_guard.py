"""Regression guard: the benchmark suite runs end to end on tiny models, and auto_tune never
keeps a selection slower than its untuned measurement (a decision, tested on given timings).

How fast the suite's rows are is the benchmark's to report, never a unit test's: two
independent timings on a busy 2-core machine differ by more than any fixed noise bound
(issue 33)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_quick_suite_runs_end_to_end(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.suite",
            "--quick",
            "--models",
            "mlp",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    payload = json.loads((tmp_path / "suite-cpu.json").read_text())
    assert payload["failed"] == []
    rows = {r["approach"]: r for r in payload["results"][0]["rows"]}
    assert {"eager", "torch.compile", "tt.auto_tune"} <= set(rows)
    assert any(name.startswith("tt inductor") for name in rows)
    assert all(r.get("median_ms") for r in rows.values()), rows
    assert (tmp_path / "suite-cpu.png").is_file()


def test_auto_tune_selection_never_slower_than_its_untuned_measurement() -> None:
    import torch

    import tunetree as tt
    from tests.fakes import Delayed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    slow = tt.HighestThroughputStrategy([Delayed(0.002)])  # every candidate slower than eager
    result = tt.auto_tune(
        model,
        [torch.randn(2, 8)],
        strategy=slow,
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
    )
    assert result.depth is None and result.model is model
    for row in result.rows:
        assert row.latency_s is None or row.latency_s > result.untuned.median_s
