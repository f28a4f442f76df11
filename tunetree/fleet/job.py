"""A fleet job: what to build, with which data, how to tune it, and where it may run.

``build`` and ``data`` are references to importable callables (``"package.module:function"``,
or a module-level function, turned into that string), resolved on the worker, so the model is
built where it is measured and nothing but names and options travels to the worker.

**Threads.** A job is measured with the threads the hosts of its kind serve with, since a
winner measured with one thread is not the winner with eight. By default a job takes a whole
node (all its CPUs in Ray's accounting, so no other job's work disturbs its measurements) and
tunes with torch's default thread count there (the node's physical cores: what a plain
process on a host of that kind uses). ``resources={"CPU": n}`` takes ``n`` CPUs and tunes with
``n`` threads instead. The row says how many threads were used.

**Time limit.** A job runs for at most ``time_limit`` seconds from its start on a node (time
spent waiting for a node does not count); past it, its worker is stopped and its row says so.
The default follows from the job's ``auto_tune`` time budget: :data:`LIMIT_BUDGET_FACTOR`
times the budget plus :data:`LIMIT_MARGIN_S` (building the model and its data, the cache's
transfers and the final checks are not counted in the budget). With ``time_budget=None``
there is no default limit; ``time_limit=math.inf`` also runs without one.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInputError
from ..search.auto import DEFAULT_TIME_BUDGET_S, QUICK_TIME_BUDGET_S

_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
RESERVED_OPTIONS = ("cache", "verbose")
"""``auto_tune`` options the fleet sets itself (the shared cache; quiet workers)."""
LIMIT_BUDGET_FACTOR = 2.0
"""The default time limit is this many times the job's time budget, plus the margin."""
LIMIT_MARGIN_S = 600.0
"""Seconds the default time limit adds to the budget's share (build, data, transfers)."""


def reference(target: str | Callable[..., Any], what: str) -> str:
    """``module:qualname`` of an importable callable (or the string itself, checked)."""
    if isinstance(target, str):
        if not _REFERENCE.fullmatch(target):
            raise InvalidInputError(
                f"Job {what}={target!r}: give an importable callable as 'package.module:function'"
            )
        return target
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not callable(target) or not module or not qualname or "<" in qualname:
        raise InvalidInputError(
            f"Job {what}={target!r}: a worker imports it by name, so give a module-level "
            "function (not a lambda, a nested function or an object), or 'module:function'"
        )
    if module == "__main__":
        raise InvalidInputError(
            f"Job {what}={qualname}: defined in the script being run (__main__), which a worker "
            "cannot import; move it into a module and give 'module:function'"
        )
    return f"{module}:{qualname}"


def resolve(ref: str) -> Callable[..., Any]:
    """Import ``module:qualname`` and return the callable (on the worker)."""
    module_name, _, qualname = ref.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise InvalidInputError(f"{ref} is not callable")
    return target  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Job:
    """One model to tune on the fleet.

    Args:
        name: The job's name (unique in one :func:`tunetree.fleet.tune`).
        build: ``"module:function"`` (or a callable) returning the model in eval mode; run on
            the worker, so the model is built where it is measured.
        data: ``"module:function"`` (or a callable) returning the dataset ``auto_tune`` takes.
        auto_tune: ``auto_tune``'s other options (``time_budget``, ``max_depth``,
            ``strategy``...; ``cache`` is the fleet's).
        resources: Ray resources that place the job: ``{"GPU": 1}``, ``{"CPU": 2}`` or a
            custom resource a kind of node offers (``{"xeon-spr": 1}``). Without ``"CPU"`` the
            job takes every CPU of the node and tunes with the node's default thread count;
            with ``{"CPU": n}`` it tunes with ``n`` threads (see the module docstring).
        time_limit: Seconds the job may run on its node before its worker is stopped (None:
            the default of :meth:`limit_s`; ``math.inf``: no limit).

    Raises:
        InvalidInputError: No name, an ``auto_tune`` option the fleet sets itself, or a
            resource amount that is negative or not a number.

    Example:
        >>> import tunetree as tt
        >>> job = tt.fleet.Job("bert", build="models:build_bert", data="models:traffic",
        ...                    auto_tune={"time_budget": 600})
    """

    name: str
    build: str | Callable[..., Any]
    data: str | Callable[..., Any]
    auto_tune: Mapping[str, Any] = field(default_factory=dict)
    resources: Mapping[str, float] = field(default_factory=dict)
    time_limit: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInputError("a Job needs a name")
        object.__setattr__(self, "build", reference(self.build, "build"))
        object.__setattr__(self, "data", reference(self.data, "data"))
        options = dict(self.auto_tune)
        taken = [k for k in RESERVED_OPTIONS if k in options]
        if taken:
            raise InvalidInputError(
                f"Job {self.name}: auto_tune={{{taken[0]!r}: ...}} is set by the fleet "
                "(the shared cache, quiet workers)"
            )
        object.__setattr__(self, "auto_tune", options)
        resources = dict(self.resources)
        for key, amount in resources.items():
            if not isinstance(key, str) or not isinstance(amount, int | float):
                raise InvalidInputError(f"Job {self.name}: resources map names to amounts")
            if not math.isfinite(amount) or amount < 0:
                raise InvalidInputError(f"Job {self.name}: resource {key} = {amount}")
        object.__setattr__(self, "resources", resources)
        limit = self.time_limit
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int | float) or not limit > 0
        ):
            raise InvalidInputError(
                f"Job {self.name}: time_limit={limit!r}: give seconds (> 0), math.inf for "
                "none, or None for the default"
            )

    @property
    def threads(self) -> int | None:
        """The threads the job tunes with: its CPUs when given, else None (the node's default)."""
        cpus = self.resources.get("CPU")
        return None if cpus is None else max(1, math.floor(cpus))

    def limit_s(self) -> float | None:
        """Seconds the job may run on its node (None: no limit).

        ``time_limit`` when given, else :data:`LIMIT_BUDGET_FACTOR` times the ``auto_tune``
        time budget (``"default"``: 300 s, 60 s with ``quick``) plus :data:`LIMIT_MARGIN_S`;
        no limit when the budget is None.
        """
        if self.time_limit is not None:
            return None if math.isinf(self.time_limit) else float(self.time_limit)
        budget = self.auto_tune.get("time_budget", "default")
        if budget is None:
            return None
        if isinstance(budget, bool) or not isinstance(budget, int | float):
            budget = QUICK_TIME_BUDGET_S if self.auto_tune.get("quick") else DEFAULT_TIME_BUDGET_S
        return LIMIT_BUDGET_FACTOR * max(float(budget), 0.0) + LIMIT_MARGIN_S

    def ray_options(self, cpus: float) -> dict[str, Any]:
        """The job's placement as Ray actor options: ``cpus`` CPUs, GPU, memory, custom."""
        resources = dict(self.resources)
        resources.pop("CPU", None)
        options: dict[str, Any] = {"num_cpus": cpus, "max_restarts": 0}
        if "GPU" in resources:
            options["num_gpus"] = resources.pop("GPU")
        if "memory" in resources:
            options["memory"] = resources.pop("memory")
        if resources:
            options["resources"] = resources
        return options
