"""The threads a fleet job tunes with: those the hosts of its kind serve with.

A Ray worker starts with ``OMP_NUM_THREADS`` set to the CPUs its task reserved (one by
default), so torch's thread count there is not the one a plain process on the same machine
gets. Timings, and so winners, depend on it: a job measured with one thread picks for hosts
that do not exist. :func:`default_threads` asks a fresh interpreter on this node, without the
thread variables, what torch's default is (the node's physical cores), and
:func:`tuning_threads` sets it for the job.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import torch

log = logging.getLogger(__name__)

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Variables that set torch's (and OpenMP's) default thread count in a new process."""
_PROBE = "import torch; print(torch.get_num_threads())"
_PROBE_TIMEOUT_S = 120.0


@functools.lru_cache(maxsize=1)
def default_threads() -> int:
    """The default torch thread count of a plain process on this machine.

    Measured in a fresh interpreter without :data:`THREAD_VARIABLES` (what a serving host
    runs with); the CPUs this process may use when that fails.
    """
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            check=True,
        )
        threads = int(out.stdout.strip().splitlines()[-1])
        if threads >= 1:
            return threads
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        log.warning("fleet: torch's default thread count not measured (%s)", exc)
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


@contextlib.contextmanager
def tuning_threads(threads: int | None) -> Iterator[int]:
    """Run the block with ``threads`` torch threads (None: :func:`default_threads`).

    The thread variables are set too, for processes the backends start; both are restored.
    Yields the thread count used.
    """
    wanted = default_threads() if threads is None else max(1, int(threads))
    before = torch.get_num_threads()
    saved = {k: os.environ.get(k) for k in THREAD_VARIABLES}
    torch.set_num_threads(wanted)
    for name in THREAD_VARIABLES:
        os.environ[name] = str(wanted)
    try:
        yield wanted
    finally:
        torch.set_num_threads(before)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
