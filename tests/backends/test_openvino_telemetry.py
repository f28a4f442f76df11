"""OpenVINO's telemetry stays off inside tunetree's OpenVINO calls.

With no consent file OpenVINO's converter counts as consented and sends events from a thread
pool that starts a process per event with ``fork`` beside the caller's threads: a test run hung
there (the tuning thread waiting in a file lock's fork gate, the forking threads on the logging
lock). tunetree converts and compiles with the home directory pointed at a private one that
holds OpenVINO's own opt-out. Run in a fresh interpreter: the telemetry object is a
process-wide singleton made on first use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openvino")
pytest.importorskip("openvino_telemetry")

SCRIPT = """
import json, torch, openvino_telemetry, tunetree as tt
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
result = tt.tune(model, [torch.randn(2, 8)], depth=0, cache=False, verbose=False,
                 strategy=tt.HighestThroughputStrategy([tt.backends.OpenVINO()]))
telemetry = openvino_telemetry.Telemetry.__dict__.get("_SingletonMetaClass__single_instance")
print(json.dumps({
    "served": all(g.winner is not None for g in result.graphs),
    "telemetry_made": telemetry is not None,
    "consent": getattr(telemetry, "consent", None),
}))
"""


def test_tuning_with_openvino_leaves_its_telemetry_opted_out_and_the_home_untouched(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["served"]
    assert report["telemetry_made"]  # the converter did start its telemetry ...
    assert report["consent"] is False  # ... opted out, so it sends nothing and forks nothing
    assert not (tmp_path / "intel").exists()  # nothing written in the user's home
