"""A second process serving :mod:`tests.live.fakes`' model through ``tt.jit``.

``python -m tests.live.app '<json>'`` prints one JSON line: the status after waiting, builds
made here, whether the first call after ``tt.jit`` (and the wait) ran on the tuned runner, and
whether its outputs match eager, and which of the ``modules`` named were imported by then.
``{"cache": DIR, "remote": URL, "modules": [NAME, ...], "budget_cut": true}`` (``budget_cut``:
:func:`fakes.budget_cut_options` instead of :func:`fakes.options`); also the warm result's
depth statuses and tuning phases.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch

import tunetree as tt
from tests.live import fakes


def main(config: dict[str, Any]) -> dict[str, Any]:
    remote = config.get("remote")
    cache = tt.TuningCache(config["cache"], remote=remote) if remote else config["cache"]
    eager = fakes.model()
    x = fakes.calls([3])[0]
    with torch.no_grad():
        expected = eager(x)
    start = time.perf_counter()
    options = fakes.budget_cut_options() if config.get("budget_cut") else fakes.options()
    served = tt.jit(fakes.model(), cache=cache, **options)
    tuned = served.wait(timeout=120)
    ready_s = time.perf_counter() - start
    fakes.RUNS.clear()
    with torch.no_grad():
        out = served(x)
    return {
        "tuned": tuned,
        "status": served.status,
        "reason": served.reason,
        "builds": list(fakes.BUILDS),
        "served_builds": served.builds,
        "first_call_tuned": fakes.runs_here() == 1,
        "equal": torch.equal(out, expected),
        "ready_s": ready_s,
        "depth_status": [r.status.name for r in served.result.rows] if served.result else [],
        "phases": [p.label for p in served.result.breakdown.phases]
        if served.result and served.result.breakdown
        else [],
        "modules": {name: name in sys.modules for name in config.get("modules", [])},
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
