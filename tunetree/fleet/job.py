"""A fleet job: what to build, with which data, how to tune it, and where it may run.

``build`` and ``data`` are references to importable callables (``"package.module:function"``,
or a module-level function, turned into that string), resolved on the worker, so the model is
built where it is measured and nothing but names and options travels to the worker.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInputError

_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
RESERVED_OPTIONS = ("cache", "verbose")
"""``auto_tune`` options the fleet sets itself (the shared cache; quiet workers)."""


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
            custom resource a kind of node offers (``{"xeon-spr": 1}``); default one CPU.

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

    def ray_options(self) -> dict[str, Any]:
        """The job's placement as Ray task options (CPU, GPU, memory, custom resources)."""
        resources = dict(self.resources)
        options: dict[str, Any] = {"num_cpus": resources.pop("CPU", 1), "max_retries": 0}
        if "GPU" in resources:
            options["num_gpus"] = resources.pop("GPU")
        if "memory" in resources:
            options["memory"] = resources.pop("memory")
        if resources:
            options["resources"] = resources
        return options
