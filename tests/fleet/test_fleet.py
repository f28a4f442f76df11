"""tt.fleet: jobs fanned out over a real local Ray into a real S3 remote, and its parts."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import tunetree as tt
from tunetree.candidates.budget import BUILD
from tunetree.fleet import FleetReport, FleetRow, Job
from tunetree.fleet.hardware import hardware_class
from tunetree.fleet.job import LIMIT_MARGIN_S
from tunetree.fleet.placement import place
from tunetree.fleet.worker import run_job

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
    assert job.ray_options(8) == {
        "num_cpus": 8,
        "num_gpus": 1,
        "resources": {"xeon": 1},
        "max_restarts": 0,
    }
    with pytest.raises(tt.InvalidInputError, match="lambda"):
        Job("x", build=lambda: None, data=jobs.data)
    with pytest.raises(tt.InvalidInputError, match="module:function"):
        Job("x", build="not a reference", data=jobs.data)
    with pytest.raises(tt.InvalidInputError, match="set by the fleet"):
        Job("x", build=jobs.tree, data=jobs.data, auto_tune={"cache": False})
    with pytest.raises(tt.InvalidInputError, match="resource"):
        Job("x", build=jobs.tree, data=jobs.data, resources={"CPU": -1})
    for bad in (0, -1, math.nan, "10", True):
        with pytest.raises(tt.InvalidInputError, match="time_limit"):
            Job("x", build=jobs.tree, data=jobs.data, time_limit=bad)  # type: ignore[arg-type]


def test_a_job_takes_a_whole_node_and_its_threads_unless_it_names_its_cpus() -> None:
    """By default a job reserves every CPU of the smallest node that can run it and tunes with
    the node's default threads (None); ``{"CPU": n}`` reserves n and tunes with n threads."""
    nodes = [{"CPU": 16.0, "xeon": 1.0}, {"CPU": 8.0, "xeon": 1.0}, {"CPU": 64.0, "GPU": 1.0}]
    whole = Job("a", build=jobs.tree, data=jobs.data, resources={"xeon": 1})
    assert place(whole, nodes).cpus == 8.0 and whole.threads is None
    assert place(Job("g", build=jobs.tree, data=jobs.data), nodes).cpus == 8.0
    four = Job("b", build=jobs.tree, data=jobs.data, resources={"xeon": 1, "CPU": 4})
    assert place(four, nodes).cpus == 4 and four.threads == 4
    greedy = Job("c", build=jobs.tree, data=jobs.data, resources={"xeon": 1, "CPU": 32})
    assert "no node" in (place(greedy, nodes).problem or "")
    assert place(Job("d", build=jobs.tree, data=jobs.data, resources={"GPU": 1}), nodes).cpus == 64


def test_a_jobs_time_limit_follows_its_time_budget_unless_given() -> None:
    def limit(**kw: object) -> float | None:
        return Job("x", build=jobs.tree, data=jobs.data, **kw).limit_s()  # type: ignore[arg-type]

    assert limit(auto_tune={"time_budget": 120}) == 2 * 120 + LIMIT_MARGIN_S
    assert limit() == 2 * 300 + LIMIT_MARGIN_S  # auto_tune's default budget
    assert limit(auto_tune={"quick": True}) == 2 * 60 + LIMIT_MARGIN_S
    assert limit(auto_tune={"time_budget": None}) is None
    assert limit(auto_tune={"time_budget": 120}, time_limit=5) == 5
    assert limit(time_limit=math.inf) is None


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
    assert "threads" in str(report)
    assert hardware_class().startswith("cpu: ")


def test_a_job_left_untuned_says_why_in_its_row_and_the_table(tmp_path: Path) -> None:
    eager_only = {**jobs.options(), "strategy": tt.OneBackendStrategy(tt.backends.Eager())}
    job = Job("eager", build=jobs.tree, data=jobs.data, auto_tune=eager_only)
    row = run_job(job, None, str(tmp_path / "node"))
    assert row.ok and row.depth is None, row
    assert row.untuned.startswith("every depth: no change: every graph kept eager"), row
    assert f"ok, untuned: {row.untuned}" in str(FleetReport([row]))
    assert FleetRow("tuned", depth=0).untuned == ""


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
        assert row.threads == torch.get_num_threads()  # the node's default, not Ray's one
        assert row.hardware == hardware_class() and row.node
    assert report["broken"].error == "RuntimeError: this model cannot be built here"
    assert "no node" in (report["nowhere"].error or "")
    again = tt.fleet.tune(fleet[:2], remote=remote, cache_dir=str(tmp_path / "node-2"))
    for row in again.rows:
        assert row.ok and row.builds == 0 and row.remote_hits == row.cache_hits > 0, row


@pytest.mark.timeout(1500)  # two searches with no budget: at a load of 15, 590 s for the first
def test_after_a_fleet_tune_a_fresh_host_of_the_kind_builds_nothing_and_serves_eagers_numbers(
    tmp_path: Path, remote: str, ray_local
) -> None:
    """Default job resources, a real strategy, real timings: the host (this process, a fresh
    local cache, its default threads) gets the fleet's winners as they were measured, with no
    build and no re-measurement. Before, the job ran with Ray's one CPU and OMP_NUM_THREADS=1,
    so every entry was re-measured here (and a changed winner made its twins build)."""
    # No time budget: the job's search always completes, so its decision and every graph's
    # winner are recorded whatever the load does to its timings. With 120 s on two cores run
    # at a load of 15, the row said "depth 0: skipped: time budget used up; depth 1: ... 23
    # candidates skipped" (tuned in-process at that load, the untuned MLP measured 215 ms a
    # call, 0.1 ms unloaded). A search the budget cut short is rightly not recorded for reuse,
    # so a fresh host searches again: not this test's question.
    options = {"max_depth": 1, "time_budget": None}
    mlp = Job("mlp", build=jobs.mlp, data=jobs.mlp_data, auto_tune=options)
    report = tt.fleet.tune([mlp], remote=remote, cache_dir=str(tmp_path / "node"))
    row = report["mlp"]
    assert row.ok and row.builds > 0 and row.remote_stored > 0, f"{report}\nuntuned: {row.untuned}"
    assert row.threads == torch.get_num_threads(), report

    model = jobs.mlp()
    cache = tt.TuningCache(tmp_path / "fresh-host", remote=remote)
    result = tt.auto_tune(model, jobs.mlp_data(), cache=cache, verbose=False, **options)
    assert result.breakdown is not None
    builds = sum(p.count for p in result.breakdown.phases if p.phase == BUILD)
    assert builds == 0 and cache.stats.remeasured == 0, (cache.stats, result)
    assert not result.skipped(), str(result)
    assert cache.stats.remote_hits > 0 and cache.stats.misses == 0, (cache.stats, str(result))
    unseen = torch.randn(5, 256, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        torch.testing.assert_close(result.model(unseen), model(unseen), rtol=1e-4, atol=1e-5)


def test_a_job_past_its_time_limit_is_a_row_its_worker_is_stopped_and_the_others_come_back(
    tmp_path: Path, remote: str, ray_local
) -> None:
    jobs.HANGS_PID.unlink(missing_ok=True)
    options = jobs.options()
    fleet = [
        Job("hangs", build=jobs.hangs, data=jobs.data, auto_tune=options, time_limit=8),
        Job("tree", build=jobs.tree, data=jobs.data, auto_tune=options),
    ]
    start = time.monotonic()
    report = tt.fleet.tune(fleet, remote=remote, cache_dir=str(tmp_path / "node"))
    assert time.monotonic() - start < 300
    hung = report["hangs"]
    assert hung.status == "timed out" and not hung.ok and report.failed() == [hung]
    assert "time limit of 8 s" in (hung.error or "") and "stopped" in (hung.error or "")
    assert 8 <= hung.wall_s < 60 and hung.node
    assert report["tree"].ok and report["tree"].builds > 0, report
    pid = int(jobs.HANGS_PID.read_text())
    for _ in range(100):  # the kill is asynchronous
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the timed-out job's worker (pid {pid}) is still running")
    assert "timed out: ran past its time limit" in str(report)
