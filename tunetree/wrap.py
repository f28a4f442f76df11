"""Swap a module's forward for a dispatcher that routes each call to the runner of its graph.

The dispatcher is set as the module's *instance* attribute ``forward``: the class, its
parameters, buffers, ``state_dict`` keys, hooks and ``.to()`` are untouched, and
deleting the attribute undoes the wrap. A call whose input signature was not tuned
runs the original forward (logged once per signature), never crashes.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

from torch import nn

from .backends.base import Runner, original_forward
from .errors import InvalidInputError
from .graph import GraphKey
from .modules import find_module, module_paths, root_modules, set_root
from .plan import Plan

log = logging.getLogger(__name__)


class Dispatcher:
    """Replaces ``module.forward``: picks the runner for the call's graph."""

    def __init__(
        self,
        module: nn.Module,
        path: str,
        runners: Mapping[GraphKey, Runner],
        plan: Plan | None = None,
    ) -> None:
        self.path = path
        self.runners = dict(runners)
        self.plan = plan
        """The plan this dispatcher belongs to (measured latencies, depth), when known."""
        self.original = original_forward(module)
        self._warned: set[GraphKey] = set()
        self._warned_opaque = False
        self._warned_training = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.original.__self__.training:
            # Runners are inference-only (an exported graph has no dropout, no autograd).
            if not self._warned_training:
                self._warned_training = True
                log.warning(
                    "%s is in training mode: running its original forward (tuned runners "
                    "serve eval mode only)",
                    self.path or "<model>",
                )
            return self.original(*args, **kwargs)
        key = GraphKey.of(args, kwargs)
        runner = self.runners.get(key)
        if runner is None:
            if key.has_opaque:  # identity-keyed objects: warn once per module, not per call
                if not self._warned_opaque:
                    self._warned_opaque = True
                    log.warning(
                        "%s: called with an object it was not tuned with (%s); running the "
                        "original forward, since a tuned runner may have baked the tuning-time "
                        "object in",
                        self.path or "<model>",
                        key,
                    )
            elif key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "%s: input signature %s was not seen while tuning; running the original "
                    "forward (tune with an input like this one to speed it up)",
                    self.path or "<model>",
                    key,
                )
            return self.original(*args, **kwargs)
        return runner(*args, **kwargs)

    def __repr__(self) -> str:
        backends = sorted({r.backend.name for r in self.runners.values()})
        return f"Dispatcher({self.path or '<model>'}: {', '.join(backends)})"


def dispatcher_of(module: nn.Module) -> Dispatcher | None:
    """The dispatcher wrapping ``module``, or None."""
    forward = module.__dict__.get("forward")
    return forward if isinstance(forward, Dispatcher) else None


def wrapped_paths(model: Any) -> list[str]:
    """Paths of every wrapped module in a model or pipeline."""
    return [path for path, module in module_paths(model) if dispatcher_of(module) is not None]


def wrap(
    model: Any,
    runners: Mapping[str, Mapping[GraphKey, Runner]],
    plan: Plan | None = None,
    *,
    in_place: bool = True,
) -> Any:
    """Wrap every module path in ``runners`` and return the model to call.

    With ``in_place=True`` modules inside the model are wrapped in place. The root module
    itself (path ``""``) is never changed: a shallow copy that shares its parameters is
    wrapped and returned. With ``in_place=False`` nothing the caller holds changes: the
    root (module or pipeline object) and every module on the way to a wrapped path are
    shallow copies sharing parameters, buffers and hooks (:func:`copy_along`). ``plan``,
    when given, is kept on every dispatcher so that saving the tuned model keeps the plan's
    measurements.
    """
    if not in_place and runners:
        model = copy_along(model, list(runners))
    elif "" in runners and isinstance(model, nn.Module):
        model = copy.copy(model)  # shares parameters, buffers, submodules and hooks
        model.__dict__.pop("forward", None)
    for path, graph_runners in runners.items():
        module = model if path == "" else find_module(model, path)
        if dispatcher_of(module) is not None:
            raise InvalidInputError(
                f"{path or '<model>'} is already wrapped: undo the previous tune first"
            )
        module.__dict__["forward"] = Dispatcher(module, path, graph_runners, plan)
    return model


def _shallow(module: nn.Module) -> nn.Module:
    """A copy sharing parameters, buffers and hooks, with its own child table and no wrap."""
    twin = copy.copy(module)
    twin.__dict__["_modules"] = dict(module._modules)
    twin.__dict__.pop("forward", None)
    return twin


def copy_along(model: Any, paths: list[str]) -> Any:
    """A shallow copy of ``model`` in which every module on the way to each of ``paths``
    (included) is its own shallow copy, so wrapping those paths leaves ``model`` untouched.
    A module reached by two paths (a shared submodule) is copied once."""
    copies: dict[int, nn.Module] = {}

    def twin_of(module: nn.Module) -> nn.Module:
        if id(module) not in copies:
            copies[id(module)] = _shallow(module)
        return copies[id(module)]

    if isinstance(model, nn.Module):
        root: Any = twin_of(model)
        prefixes = {"": model}
    else:
        root = copy.copy(model)
        prefixes = root_modules(model)
    for path in paths:
        prefix = next(
            p
            for p in sorted(prefixes, key=len, reverse=True)
            if p == "" or path == p or path.startswith(p + ".")
        )
        parent = twin_of(prefixes[prefix])
        if prefix:
            set_root(root, prefix, parent)
        rest = path[len(prefix) :].lstrip(".")
        for name in rest.split(".") if rest else []:
            child = twin_of(parent._modules[name])  # type: ignore[arg-type]
            parent._modules[name] = child
            parent = child
    return root


def unwrap(model: Any) -> list[str]:
    """Remove every dispatcher from ``model``; returns the paths that were unwrapped."""
    undone = []
    for path, module in module_paths(model):
        if dispatcher_of(module) is not None:
            del module.__dict__["forward"]
            undone.append(path)
    return undone
