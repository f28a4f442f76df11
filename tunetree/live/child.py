"""A cold tune in a child process: its own interpreter, so its Python never holds serving's GIL.

A build's exports and conversions are Python-heavy; in a thread of the serving process they
hold the GIL, and serving threads then get it back only every switch interval, hundreds of
times per forward (a call beside ``torch.export`` took 14.7 ms alone, seconds beside it). A
child process has its own GIL and, at a lower nice value for the whole process, yields the
cores to serving too. It writes its graphs and depth decision to the tuning cache; the serving
process then loads that plan from the cache as a second process would (nothing to build) and
checks it against eager before it serves.

The parent writes the job (a private copy of the model, the recorded calls, the ``call``
function, the ``auto_tune`` options, the cache's directory and remote) with ``torch.save``
into a directory only this user can read, made for this job, and starts a child interpreter
that lowers its own priority first (:data:`BOOT`), then runs :func:`main` on that directory.
The child unpickles that file: it is the parent's own, never a file from a cache or a remote.
What the child tells back (:class:`ChildOutcome`) is small JSON, read bounded. The child exits
when its parent does (it polls its parent's pid).

A model, ``call`` or option that cannot be pickled and imported by a fresh interpreter (a
class defined in ``__main__`` or inside a function, a lambda) is tuned in a thread instead:
:func:`why_not_in_child` says why.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .._util.fs import read_regular
from .._util.json_io import loads_bounded
from ..candidates.budget import BUILD
from ..search.auto_result import AutoTuneResult
from ..search.recorded import RecordedPlan, RecordedPlanError

log = logging.getLogger("tunetree.live")

JOB_FILE = "job.pt"
OUTCOME_FILE = "outcome.json"
LOG_FILE = "child.log"
LOG_TAIL_BYTES = 64 << 10
"""How much of the child's output the parent logs at DEBUG (its last bytes)."""
MAX_OUTCOME_BYTES = 1 << 20
"""Largest outcome read (a plan is about 300 bytes per graph)."""
PARENT_POLL_S = 0.5
BOOT = (
    "import os, sys\n"
    "nice = int(sys.argv[3])\n"
    "if nice > 0 and hasattr(os, 'nice'):\n"
    "    os.nice(nice)\n"
    "from tunetree.live.child import main\n"
    "sys.exit(main(sys.argv[1:3]))\n"
)
"""The child's first lines: its priority is lowered before it imports anything (importing
torch and unpickling the model are seconds of CPU that would otherwise compete with serving)."""
START_MARGIN_S = 300.0
"""Beyond twice the tune's time budget, how long the child may take before it is killed."""


@dataclass
class ChildOutcome:
    """What a child's tune reports back (its plan itself is in the tuning cache)."""

    depth: int | None
    """The depth it kept; None when it left the model untuned (or failed)."""
    builds: int = 0
    reason: str = ""
    """Why it left the model untuned, or what failed."""
    failed: bool = False
    """The child did not tune (could not load the job, crashed, timed out)."""
    plan: RecordedPlan | None = None
    """The plan it kept (loaded here as it is, from the cache); None without one."""


@dataclass
class ChildJob:
    """Everything a child needs, pickled by the parent into its private job directory."""

    model: Any
    samples: list[Any]
    call: Any
    options: dict[str, Any]
    directory: str
    remote: dict[str, Any] | None
    threads: int
    nice: int
    log_level: int = logging.WARNING
    """The level of the parent's ``tunetree`` logger: the child logs at it into its output,
    which the parent logs at DEBUG when the child ends."""


def _importable(obj: Any) -> str | None:
    """Why a fresh interpreter could not import ``obj``'s class or function by name, or None."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", "")
    if module in (None, "__main__") or "<" in qualname:
        return f"{qualname or obj!r} is defined in {module or 'no module'}" + (
            " inside a function" if "<" in qualname else ""
        )
    return None


def builds_of(result: AutoTuneResult | None) -> int:
    """Candidates built by one auto_tune (0 when every graph came from the cache)."""
    if result is None or result.breakdown is None:
        return 0
    return sum(p.count for p in result.breakdown.phases if p.phase == BUILD)


def why_not_in_child(model: Any, call: Any, options: dict[str, Any], cache: Any) -> str | None:
    """Why this tune cannot run in a child process (then it runs in a thread), or None."""
    directory = getattr(cache, "directory", None)
    if directory is None:
        return "there is no tuning cache directory to pass the plan back through"
    if call is not None and (problem := _importable(call)):
        return f"the call function cannot be pickled by name: {problem}"
    modules = model.modules() if isinstance(model, torch.nn.Module) else [model]
    for module in modules:
        if problem := _importable(type(module)):
            return f"the model cannot be rebuilt in another interpreter: {problem}"
    try:
        pickle.dumps(options)
    except Exception as exc:
        return f"the auto_tune options cannot be pickled: {exc}"
    return None


def remote_spec(cache: Any) -> dict[str, Any] | None:
    """The parent's remote tier as keyword arguments of ``RemoteTier`` (None: no remote)."""
    remote = getattr(cache, "remote", None)
    if remote is None:
        return None
    return {
        "url": remote.url,
        "secret": remote.secret or b"",
        "trust_unsigned": remote.trust_unsigned,
        "timeouts": remote.client.timeouts,
        "endpoint_url": remote.client.endpoint_url,
    }


class ChildTune:
    """One child process running one cold tune; :meth:`run` blocks until it ends."""

    def __init__(self, job: ChildJob, time_budget_s: float | None) -> None:
        self.job = job
        self.limit_s = None if time_budget_s is None else 2 * time_budget_s + START_MARGIN_S
        self._proc: subprocess.Popen[bytes] | None = None
        self._killed = False

    def run(self) -> ChildOutcome:
        """Write the job, start the child, wait for it, read its outcome; never raises."""
        workdir = Path(tempfile.mkdtemp(prefix="tunetree-jit-"))  # mode 0700
        try:
            torch.save(self.job, workdir / JOB_FILE)
            return self._wait(workdir)
        except Exception as exc:
            return ChildOutcome(None, reason=f"{type(exc).__name__}: {exc}", failed=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _wait(self, workdir: Path) -> ChildOutcome:
        with open(workdir / LOG_FILE, "wb") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", BOOT, str(workdir), str(os.getpid()), str(self.job.nice)],
                env=_child_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            if self._killed:  # stopped while the job was being written
                self._proc.kill()
            log.info("tt.jit: tuning in a child process (pid %d)", self._proc.pid)
            try:
                code = self._proc.wait(self.limit_s)
            except subprocess.TimeoutExpired:
                self.kill()
                self._proc.wait()
                return ChildOutcome(None, reason=f"no outcome in {self.limit_s:.0f} s", failed=True)
        if self._killed:
            return ChildOutcome(None, reason="stopped", failed=True)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("tt.jit: the child's log:\n%s", _tail(workdir / LOG_FILE, LOG_TAIL_BYTES))
        try:
            return _outcome(read_regular(workdir / OUTCOME_FILE, MAX_OUTCOME_BYTES))
        except (OSError, ValueError) as exc:
            tail = _tail(workdir / LOG_FILE, 2000)
            log.debug("tt.jit: the child's output:\n%s", tail)
            last = tail.strip().splitlines()[-1:] or [f"exit status {code}"]
            return ChildOutcome(None, reason=f"the child ended ({exc}): {last[0]}", failed=True)

    def kill(self) -> None:
        """Stop the child now (the served model was undone or given up)."""
        self._killed = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()


def _tail(path: Path, size: int) -> str:
    """The last ``size`` bytes of ``path`` as text (the child's output; it may be long)."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - size))
        return f.read().decode(errors="replace")


def _child_env() -> dict[str, str]:
    """This environment, with this interpreter's import path: the child imports what it does."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    return env


def _outcome(raw: bytes) -> ChildOutcome:
    """The child's outcome file, checked field by field."""
    data = loads_bounded(raw, MAX_OUTCOME_BYTES)
    if not isinstance(data, dict):
        raise ValueError("the outcome is not an object")
    depth, builds = data.get("depth"), data.get("builds", 0)
    reason, failed = data.get("reason", ""), data.get("failed", False)
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
        raise ValueError("depth is not a depth")
    if not isinstance(builds, int) or not isinstance(reason, str) or not isinstance(failed, bool):
        raise ValueError("a field has the wrong type")
    plan = None
    if data.get("plan") is not None:
        if depth is None:
            raise ValueError("a plan but no depth kept")
        try:
            plan = RecordedPlan.from_json(data["plan"], "the child's plan", depth)
        except RecordedPlanError as exc:
            raise ValueError(str(exc)) from exc
    return ChildOutcome(depth, builds, reason[:2000], failed, plan)


# ---------------------------------------------------------------------- the child's side


def _exit_with_parent(parent: int) -> None:
    """End this process as soon as its parent is gone (the serving process exited)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(3)

    threading.Thread(target=watch, name="tunetree-jit-parent-watch", daemon=True).start()


def _log_to_output(level: int) -> None:
    """Log ``tunetree`` records at ``level`` to this process's output (the job's log file)."""
    if level >= logging.WARNING:
        return  # warnings reach the output anyway (Python's last-resort handler)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(relativeCreated)8.0f %(name)s %(message)s"))
    package = logging.getLogger("tunetree")
    package.addHandler(handler)
    package.setLevel(level)


def _tune(job: ChildJob) -> ChildOutcome:
    from ..cache import TuningCache
    from ..cache.remote import RemoteTier
    from ..search.auto import auto_tune

    remote = RemoteTier(**job.remote) if job.remote is not None else False
    cache = TuningCache(job.directory, remote=remote)
    result = auto_tune(
        job.model, job.samples, call=job.call, cache=cache, verbose=False, **job.options
    )
    reason = ""
    if result.depth is None:
        skipped = result.skipped()
        reason = (
            f"the time budget ran out before {len(skipped)} pieces of the search"
            if skipped
            else f"no plan was faster than the model's own forward on {len(job.samples)} "
            "recorded calls"
        )
    log.debug("tt.jit child:\n%s", result)
    return ChildOutcome(result.depth, builds_of(result), reason, plan=RecordedPlan.of(result))


def main(argv: list[str]) -> int:
    """Run the job in ``argv[0]`` (a directory) for parent ``argv[1]``, write its outcome."""
    workdir, parent = Path(argv[0]), int(argv[1])
    _exit_with_parent(parent)
    try:
        job: ChildJob = torch.load(workdir / JOB_FILE, weights_only=False)  # the parent's own
    except Exception as exc:
        outcome = ChildOutcome(None, reason=f"could not load the job: {exc}", failed=True)
    else:
        torch.set_num_threads(job.threads)
        _log_to_output(job.log_level)
        try:
            outcome = _tune(job)
        except Exception as exc:
            outcome = ChildOutcome(None, reason=f"{type(exc).__name__}: {exc}", failed=True)
    tmp = workdir / (OUTCOME_FILE + ".tmp")
    record = asdict(outcome)
    record["plan"] = outcome.plan.to_json() if outcome.plan is not None else None
    tmp.write_text(json.dumps(record))
    os.replace(tmp, workdir / OUTCOME_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
