"""Many hosts at once: 8 writer processes, each with its own local cache, one real S3 remote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunetree.cache.remote import RemoteTier
from tunetree.cache.remote_maintenance import remote_entries

from .test_cache_processes import ROOT, fresh


@pytest.mark.slow
def test_eight_concurrent_writers_of_the_same_and_different_keys(
    tmp_path: Path, remote: str
) -> None:
    configs = [
        {
            "depths": [0, 1, 2],
            "shapes": [[4 if i % 2 else 6]],
            "remote": remote,
            "build_delay_s": 0.2,
        }
        for i in range(8)
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes = []
    for i, config in enumerate(configs):
        process_env = {**env, "TUNETREE_CACHE_DIR": str(tmp_path / f"host-{i}")}
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.cache.fakes", json.dumps(config)],
                env=process_env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in reports)  # never a wrong number, whoever won each race
    # One whole entry per key (5 graphs x 2 batch sizes), every artifact there and sound.
    infos = remote_entries(RemoteTier(remote), deep=True)
    assert len(infos) == 10 and [i.problem for i in infos] == [None] * 10
    assert sum(r["remote_stored"] for r in reports) == 10  # If-None-Match: one winner per key
    for rows in (4, 6):  # each batch size is another graph, with keys of its own
        config = {"depths": [0, 1, 2], "shapes": [[rows]], "remote": remote, "build_delay_s": 0.2}
        later = fresh(tmp_path / f"later-{rows}", config)
        assert later["builds"] == [] and later["remote_hits"] == 5 and later["ok"]
