"""tt.fleet: jobs fanned out over a real local Ray into a real S3 remote, and its parts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tunetree as tt
from tunetree.fleet import FleetReport, FleetRow, Job
from tunetree.fleet.hardware import hardware_class

from . import jobs

ROOT = Path(__file__).resolve().parents[2]


def test_fleet_is_an_attribute_of_tunetree_and_imports_no_ray() -> None:
    imported = "print('ray' in sys.modules, 'boto3' in sys.modules)"
    code = f"import sys, tunetree as tt; tt.fleet.Job; {imported}"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"], out.stderr[-2000:]


def test_a_job_names_importable_callables_only() -> None:
    job = Job(
        "tree", build=jobs.tree, data="tests.fleet.jobs:data", resources={"GPU": 1, "xeon": 1}
    )
    assert job.build == "tests.fleet.jobs:tree"
    assert job.ray_options() == {
        "num_cpus": 1,
        "num_gpus": 1,
        "resources": {"xeon": 1},
        "max_retries": 0,
    }
    with pytest.raises(tt.InvalidInputError, match="lambda"):
        Job("x", build=lambda: None, data=jobs.data)
    with pytest.raises(tt.InvalidInputError, match="module:function"):
        Job("x", build="not a reference", data=jobs.data)
    with pytest.raises(tt.InvalidInputError, match="set by the fleet"):
        Job("x", build=jobs.tree, data=jobs.data, auto_tune={"cache": False})
    with pytest.raises(tt.InvalidInputError, match="resource"):
        Job("x", build=jobs.tree, data=jobs.data, resources={"CPU": -1})


def test_the_report_groups_rows_by_hardware_class_and_never_merges_them() -> None:
    report = FleetReport(
        [
            FleetRow("a", hardware="cpu: Xeon [1]", speedup=2.0, builds=3),
            FleetRow("a", hardware="cpu: EPYC [2]", speedup=1.1, builds=3),
            FleetRow("b", status="failed", hardware="cpu: EPYC [2]", error="RuntimeError: no"),
        ]
    )
    assert {k: len(v) for k, v in report.by_hardware().items()} == {
        "cpu: Xeon [1]": 1,
        "cpu: EPYC [2]": 2,
    }
    assert [r.job for r in report.failed()] == ["b"]
    assert "failed: RuntimeError: no" in str(report) and "2.00x" in str(report)
    assert hardware_class().startswith("cpu: ")


def test_fleet_tunes_jobs_over_ray_into_the_remote_and_a_new_host_builds_nothing(
    tmp_path: Path, remote: str, ray_local
) -> None:
    options = jobs.options()
    fleet = [
        Job("tree", build=jobs.tree, data=jobs.data, auto_tune=options),
        Job("wide", build=jobs.wide_tree, data=jobs.wide_data, auto_tune=options),
        Job("broken", build=jobs.broken, data=jobs.data, auto_tune=options),
        Job("nowhere", build=jobs.tree, data=jobs.data, resources={"no-such-node": 1}),
    ]
    report = tt.fleet.tune(fleet, remote=remote, cache_dir=str(tmp_path / "node-1"))
    assert [r.job for r in report.rows] == ["tree", "wide", "broken", "nowhere"]
    for name in ("tree", "wide"):
        row = report[name]
        assert row.ok and row.builds > 0 and row.remote_stored > 0, row
        assert row.hardware == hardware_class() and row.node
    assert report["broken"].error == "RuntimeError: this model cannot be built here"
    assert "no node" in (report["nowhere"].error or "")
    again = tt.fleet.tune(fleet[:2], remote=remote, cache_dir=str(tmp_path / "node-2"))
    for row in again.rows:
        assert row.ok and row.builds == 0 and row.remote_hits == row.cache_hits > 0, row
