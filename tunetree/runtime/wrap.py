"""Swap a module's forward for a dispatcher that routes each call to the runner of its graph.

The dispatcher is set as the module's *instance* attribute ``forward``: the class, its
parameters, buffers, ``state_dict`` keys, hooks and ``.to()`` are untouched, and
deleting the attribute undoes the wrap. A call whose input signature was not tuned
runs the original forward (logged once per signature), never crashes.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..backends.base import Runner
from ..errors import InvalidInputError
from ..signature.binding import ArgumentPlan, Binder, call_signature
from ..signature.graph import GraphKey
from ..signature.modules import find_module, module_paths, root_modules, set_root
from ..signature.stateful import CallState, call_state
from . import messages
from .autograd import AutogradNeed
from .plan import Plan

log = logging.getLogger(__name__)


MEMO_LIMIT = 4096
"""Most exact signatures a dispatcher remembers its routing decision for (then it forgets)."""

_MISS = object()


class Dispatcher:
    """Replaces ``module.forward``: picks the runner for the call's graph.

    A call is bound to the forward's signature first (:mod:`tunetree.signature.binding`), so
    equivalent calls share a graph. An exact signature tuned as such goes straight to its
    runner; otherwise the first ranged graph of the same pattern whose ranges hold the
    call's sizes serves it. Decisions are remembered per exact signature; for calls of
    tensors and plain constants (the common case) so is the binding
    (:class:`~tunetree.signature.binding.ArgumentPlan`), so a steady stream of calls costs a cheap
    signature (:func:`~tunetree.signature.binding.call_signature`) and one dict lookup each.
    """

    def __init__(
        self,
        module: nn.Module,
        path: str,
        runners: Mapping[GraphKey, Runner],
        plan: Plan | None = None,
    ) -> None:
        self.path = path
        self.runners = runners
        self.plan = plan
        """The plan this dispatcher belongs to (measured latencies, depth), when known."""
        self.original = type(module).forward.__get__(module, type(module))
        """The class's forward, bound: the fallback calls it exactly as the module was called."""
        self.binder = Binder.of_module(module)
        # Callers that inspect forward (Hugging Face's generate) see the real parameters.
        with contextlib.suppress(TypeError, ValueError):
            self.__signature__ = inspect.signature(self.original)
        self.fallback_calls = 0
        """Calls this dispatcher served with the original forward (no runner for them)."""
        self.served: set[GraphKey] = set()
        """The tuned keys whose runner served a call (routing decisions are made once per
        exact signature, so this costs nothing per call): a tuned graph missing here never
        matched a call, whatever its tuning measured."""
        self._warned: set[GraphKey] = set()
        self._warned_opaque = False
        self._warned_training = False
        self._needs_autograd = AutogradNeed(module)
        self._warned_autograd = False
        self.call_state: CallState = call_state()
        """Readies the state objects a call passes (a fresh cache) before the call is keyed,
        learning from the first such call what that takes (:mod:`tunetree.signature.stateful`)."""

    @property
    def runners(self) -> dict[GraphKey, Runner]:
        """The runner of each tuned graph (exact or ranged key)."""
        return self._runners

    @runners.setter
    def runners(self, runners: Mapping[GraphKey, Runner]) -> None:
        self._runners = dict(runners)
        self._runner_list = list(dict.fromkeys(self._runners.values()))
        self._owners = [r for r in self._runner_list if type(r).owned_ids is not Runner.owned_ids]
        """The runners that may own state objects (the others own none: not asked per call)."""
        self._exact = {k: r for k, r in self._runners.items() if not k.is_dynamic}
        self._routes: dict[GraphKey, Runner | None] = {}
        self._by_signature: dict[
            tuple[Any, ...], tuple[Callable[..., Any] | None, ArgumentPlan]
        ] = {}
        """Per exact call signature: what serves it (None: the original forward) and how its
        arguments bind."""
        self._ranged: dict[GraphKey, list[tuple[GraphKey, Runner]]] = {}
        for key, runner in self._runners.items():
            if key.is_dynamic:
                self._ranged.setdefault(key.pattern(), []).append((key, runner))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Serve a call with the runner for its signature, or the original forward.

        The original forward runs in training mode and for a call whose output needs autograd
        (grad mode on, a parameter or an input requiring grad), each with a warning once, and for
        signatures no runner serves.
        """
        if self.original.__self__.training:
            # Runners are inference-only (an exported graph has no dropout, no autograd).
            if not self._warned_training:
                self._warned_training = True
                log.warning(
                    "%s is in training mode: running its original forward (tuned runners "
                    "serve eval mode only)",
                    self.path or "<model>",
                )
            self.fallback_calls += 1
            return self.original(*args, **kwargs)
        if torch.is_grad_enabled() and self._needs_autograd(args, kwargs):
            return self._keep_autograd(args, kwargs)
        # Asked of the runners only when the call holds more than tensors (a cache object).
        owned: Callable[[], frozenset[int]] | frozenset[int] = (
            self._owned if self._owners else frozenset()
        )
        signature = call_signature(args, kwargs, owned)
        memo = self._by_signature.get(signature) if signature is not None else None
        if memo is not None:  # a call of tensors and constants with a signature seen before
            served, binding = memo
            if served is None:
                self.fallback_calls += 1
                return self.original(*args, **kwargs)
            bound_args, bound_kwargs = binding.apply(args, kwargs)
            return served(*bound_args, **bound_kwargs)
        # State objects the call passes are readied before it is keyed (no signature of an
        # unready object is remembered: each such call comes this way).
        ready = self.call_state.prepare(args, kwargs)
        if ready is False:
            return self._learn_call_state(args, kwargs)
        if ready:
            signature = call_signature(args, kwargs, owned)
        return self._route_call(args, kwargs, signature)

    def _route_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], signature: tuple[Any, ...] | None
    ) -> Any:
        """Serve a call whose signature is not remembered yet, and remember it."""
        bound_args, bound_kwargs = self.binder.bind(args, kwargs)
        key = GraphKey.of(bound_args, bound_kwargs)
        runner: Any = self._routes.get(key, _MISS)
        if runner is _MISS:
            runner = self.route(key)
        learned = None
        if signature is not None:
            learned = ArgumentPlan.learn((args, kwargs), (bound_args, bound_kwargs))
            if learned is not None:
                if len(self._by_signature) >= MEMO_LIMIT:
                    self._by_signature.clear()
                self._by_signature[signature] = (runner, learned)
        if runner is None:  # exactly as the user called it: a decorator may read keywords
            self.fallback_calls += 1
            return self.original(*args, **kwargs)
        output = runner(*bound_args, **bound_kwargs)
        if signature is not None and learned is not None:  # next time: straight to its part
            direct = runner.for_call(bound_args, bound_kwargs)
            if direct is not runner:
                self._by_signature[signature] = (direct, learned)
        return output

    def _keep_autograd(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the original forward for a call whose output needs autograd history.

        Runners return outputs without it (:mod:`.autograd`); warned once.
        """
        if not self._warned_autograd:
            self._warned_autograd = True
            log.warning(
                "%s: called under grad mode with parameters or inputs that require grad: "
                "running its original forward, since tuned runners return outputs without "
                "autograd history (call it under torch.inference_mode() or torch.no_grad() "
                "to use them)",
                self.path or "<model>",
            )
        self.fallback_calls += 1
        return self.original(*args, **kwargs)

    def _learn_call_state(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the original forward on state objects not ready yet, learning from the call.

        Once per dispatcher and kind of object: the tuning's own calls taught the inspection,
        not this dispatcher.
        """
        log.debug(
            "%s: a call's state objects cannot be readied yet: the original forward serves it "
            "and teaches the dispatcher",
            self.path or "<model>",
        )
        self.fallback_calls += 1
        output = self.original(*args, **kwargs)
        self.call_state.learn(args, kwargs, output)
        return output

    def _owned(self) -> frozenset[int]:
        """Ids of the state objects the runners returned and own (see ``Runner.owned_ids``)."""
        found = [ids for runner in self._owners if (ids := runner.owned_ids())]
        if not found:
            return frozenset()
        return found[0] if len(found) == 1 else frozenset().union(*found)

    def route(self, key: GraphKey) -> Runner | None:
        """The runner serving the exact signature ``key`` (None: the original forward).

        It is remembered for the next call with it.
        """
        runner = self._exact.get(key)
        serving: GraphKey | None = key if runner is not None else None
        if runner is None:
            serving, runner = next(
                ((k, r) for k, r in self._ranged.get(key.pattern(), []) if k.accepts(key)),
                (None, None),
            )
        if serving is None:
            self._warn(key)
        else:
            self.served.add(serving)
        if len(self._routes) >= MEMO_LIMIT:
            self._routes = {}
        self._routes[key] = runner
        return runner

    def _warn(self, key: GraphKey) -> None:
        """Log once why a call takes the original forward."""
        where = self.path or "<model>"
        if key.has_opaque:  # identity-keyed objects: warn once per module, not per call
            if not self._warned_opaque:
                self._warned_opaque = True
                log.warning(
                    "%s: called with an object it was not tuned with (%s); running the "
                    "original forward, since a tuned runner may have baked the tuning-time "
                    "object in",
                    where,
                    key,
                )
            return
        unserved = self.plan.unserved_graph(self.path, key) if self.plan is not None else None
        if unserved is not None:  # a graph of the tuning's own calls, left without a runner
            if unserved[0] not in self._warned:
                self._warned.add(unserved[0])
                log.warning(messages.no_runner(self.path, *unserved))
            return
        pattern = key.pattern()
        ranges = self._ranged.get(pattern)
        # One warning per pattern when ranges exist (every size outside them), else per key.
        once = pattern if ranges else key
        if once in self._warned:
            return
        self._warned.add(once)
        if ranges:
            log.warning(
                "%s: input %s is outside the tuned range%s %s (%s); running the original "
                "forward (tune with inputs of these sizes to widen the range)",
                where,
                key,
                "s" if len(ranges) > 1 else "",
                " or ".join(str(k) for k, _ in ranges),
                "; ".join(messages.outside_range(k, key) for k, _ in ranges),
            )
        else:
            log.warning(
                "%s: input signature %s was not seen while tuning; running the original "
                "forward (tune with an input like this one to speed it up)",
                where,
                key,
            )

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


def serve_alone(model: Any) -> int:
    """Tell the runners that serve the whole ``model`` that nothing runs between their calls.

    For a dedicated serving process whose only work is this model: a runner may then trade
    idle CPU for latency (ONNX Runtime lets its threads spin between calls). Off by default,
    because in a process that does anything else between calls (a tokenizer,
    post-processing, another model, the web server) spinning threads take the cores from that
    work. Only runners of the root module (depth 0) are told, and not those serving
    generation steps (a graph taking a cache): the generate loop runs torch code between
    them, which spinning threads would slow down. The runners are shared with every model
    they serve.

    Args:
        model: A tuned model (``result.model``); anything else tells no runner.

    Returns:
        How many runners were told.

    Example:
        >>> import torch, tunetree as tt
        >>> model = torch.nn.Linear(8, 8).eval()
        >>> result = tt.tune(model, [torch.randn(2, 8)], strategy=tt.OneBackendStrategy(
        ...     tt.backends.OnnxRuntime()), cache=False, verbose=False,
        ...     measure_config=tt.MeasureConfig.quick())
        >>> tt.serve_alone(result.model), tt.serve_alone(model)
        (1, 0)
    """
    if not isinstance(model, nn.Module):
        return 0
    dispatcher = dispatcher_of(model)
    if dispatcher is None:
        return 0
    told = {id(r): r for k, r in dispatcher.runners.items() if not k.holds_cache}
    for runner in told.values():
        runner.serve_alone()
    return len(told)


def _shallow(module: nn.Module) -> nn.Module:
    """A copy sharing parameters, buffers and hooks, with its own child table and no wrap."""
    twin = copy.copy(module)
    twin.__dict__["_modules"] = dict(module._modules)
    twin.__dict__.pop("forward", None)
    return twin


def copy_along(model: Any, paths: list[str]) -> Any:
    """A shallow copy of ``model`` whose modules on the way to each of ``paths`` are copied too.

    Every module on the way to each path (included) is its own shallow copy, so wrapping those paths
    leaves ``model`` untouched. A module reached by two paths (a shared submodule) is copied once.
    """
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
    """Remove every wrap from ``model``, so that each module runs its own forward again.

    For a model whose modules were wrapped in place at a deeper cut (``result.undo()`` does
    it for the tune's own model), e.g. before tuning it again: a wrapped model is refused.

    Args:
        model: A tuned model, or one whose modules were wrapped in place.

    Returns:
        The paths of the modules unwrapped (``""`` for the root).

    Example:
        >>> import torch, tunetree as tt
        >>> model = torch.nn.Linear(8, 8).eval()
        >>> result = tt.tune(model, [torch.randn(2, 8)], strategy=tt.OneBackendStrategy(
        ...     tt.backends.OnnxRuntime()), cache=False, verbose=False,
        ...     measure_config=tt.MeasureConfig.quick())
        >>> tt.unwrap(result.model), tt.unwrap(result.model)
        ([''], [])
    """
    undone = []
    for path, module in module_paths(model):
        if dispatcher_of(module) is not None:
            del module.__dict__["forward"]
            undone.append(path)
    return undone
