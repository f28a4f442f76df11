"""Bind a call's arguments to the forward's signature, so equivalent calls share one graph.

``f(x, y)``, ``f(x, y=y)``, ``f(y=y, x=x)`` and a call that omits an optional argument
instead of passing its default are the same call. The canonical form: every parameter that
can be passed by position is (defaults filled in between), trailing arguments equal to
their default are dropped, keyword-only and ``**kwargs`` entries stay keywords (those equal
to their default dropped). The recorder and the dispatcher both key calls in this form and
runners are built and called with it.

A decorated forward (one with ``__wrapped__``, such as Hugging Face's
``merge_with_config_defaults``) may read keywords itself and pass them on again, so it is
never handed a keyword parameter by position: :meth:`Binder.call_form` turns a canonical
call back into the keyword form such a forward expects (:func:`forward_caller`).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..hf.caches import is_cache_class
from ..hf.positions import Derived, key_value

_CONSTANTS = (type(None), bool, int, float, str)
_PLAIN = (*_CONSTANTS, torch.dtype, torch.device)
"""Values a call signature holds by value (everything else by its contents, or not at all)."""


def _is_default(value: Any, default: Any) -> bool:
    if default is inspect.Parameter.empty:
        return False
    if value is default:
        return True
    return type(value) is type(default) and isinstance(value, _CONSTANTS) and value == default


class Binder:
    """The canonical form of calls to one module's forward (built once per module)."""

    def __init__(self, forward: Any) -> None:
        try:
            signature = inspect.signature(forward)
        except (TypeError, ValueError):  # builtins, odd callables: key calls as given
            signature = None
        by_position = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = list(signature.parameters.values()) if signature is not None else []
        if not params or params[0].kind not in by_position:  # no `self` to bind: key as given
            signature, params = None, []
        params = params[1:]
        self.signature = signature
        self.positional = [p for p in params if p.kind in by_position]
        self.names = [p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]
        """Parameter names (no ``self``, no ``*args``), for naming inputs in ``dynamic_shapes``."""
        self.defaults = {p.name: p.default for p in params}
        self.has_var_positional = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
        self.positional_only = sum(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in params)

    @classmethod
    def of_module(cls, module: Any) -> Binder:
        """The binder of ``type(module).forward`` (the class's forward, never a dispatcher)."""
        return cls(type(module).forward)

    def _plain(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """True when the call is already canonical: positional only, no trailing default."""
        if kwargs or len(args) > len(self.positional):
            return False
        return not args or not _is_default(args[-1], self.positional[len(args) - 1].default)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        """The canonical ``(args, kwargs)`` of one call.

        The call as given when it does not bind (the forward will raise its own error).
        """
        if self.signature is None or self._plain(args, kwargs):
            return args, kwargs
        try:
            bound = self.signature.bind(None, *args, **kwargs)
        except TypeError:
            return args, kwargs
        bound.apply_defaults()
        positional = list(bound.args[1:])
        if not self.has_var_positional or len(positional) <= len(self.positional):
            while positional and _is_default(
                positional[-1], self.positional[len(positional) - 1].default
            ):
                positional.pop()
        keywords = {
            k: v
            for k, v in bound.kwargs.items()
            if not _is_default(v, self.defaults.get(k, inspect.Parameter.empty))
        }
        return tuple(positional), keywords

    def call_form(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        """A canonical call with every keyword-capable parameter passed by keyword.

        Positional-only parameters stay positional, and so does everything when the forward
        takes ``*args``; an argument equal to its parameter's default is left out (the
        forward's own default, or its decorator's, applies as when the user omits it).
        """
        if self.signature is None or self.has_var_positional:
            return args, kwargs
        head = args[: self.positional_only]
        named = zip(self.positional[self.positional_only :], args[len(head) :], strict=False)
        keywords = {p.name: value for p, value in named if not _is_default(value, p.default)}
        keywords.update(kwargs)
        return head, keywords


def forward_caller(forward: Any, bound: Any) -> Any:
    """``bound`` (the bound ``forward``), called with canonical arguments.

    An undecorated forward takes the canonical form as it is. A decorated one gets the keyword
    form (:meth:`Binder.call_form`), since its wrapper may read keyword arguments itself:
    Hugging Face's adds ``use_cache`` as a keyword, so a canonical call passing it by position
    would raise ``got multiple values for argument 'use_cache'``.
    """
    if getattr(forward, "__wrapped__", None) is None:
        return bound
    binder = Binder(forward)
    if binder.signature is None or binder.has_var_positional:
        return bound

    def call(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = binder.call_form(args, kwargs)
        return bound(*args, **kwargs)

    call.__wrapped__ = bound  # type: ignore[attr-defined]
    return call


def original_forward(module: nn.Module) -> Any:
    """The module's forward as its class defines it, bound to the module.

    Never a tunetree dispatcher, so a runner that calls it cannot recurse into itself. It takes
    calls in this module's canonical form; a decorated forward receives them in keyword form
    (:func:`forward_caller`).
    """
    forward = type(module).forward
    return forward_caller(forward, forward.__get__(module, type(module)))


Source = tuple[str, Any]
"""Where one canonical argument comes from: ``("a", index)`` or ``("k", name)`` in the call,
or ``("c", value)``, a constant (a filled-in default, or a constant the call passed)."""


@dataclasses.dataclass(frozen=True)
class ArgumentPlan:
    """How :meth:`Binder.bind` rearranged one call, to repeat it without binding again.

    Learned from a call and its canonical form; it holds for every later call with the same
    :func:`call_signature` (same positional count, keyword names and constants, tensors in the
    same places), since binding depends on nothing else. Tensors and other objects (a cache)
    are found by identity, so a call passing one object in two places has no plan (the next
    call may pass two).
    """

    positional: tuple[Source, ...]
    keywords: tuple[tuple[str, Source], ...]
    unchanged: bool
    """True when the canonical form is the call itself: :meth:`apply` returns it as given."""

    @classmethod
    def learn(
        cls, call: tuple[tuple[Any, ...], dict[str, Any]], bound: tuple[tuple, dict]
    ) -> ArgumentPlan | None:
        """The plan taking ``call`` to ``bound``; None when an object appears twice in ``call``."""
        args, kwargs = call
        sources: dict[int, Source] = {}
        for source, value in [
            *((("a", i), v) for i, v in enumerate(args)),
            *((("k", k), v) for k, v in kwargs.items()),
        ]:
            if not isinstance(value, _PLAIN):
                if id(value) in sources:
                    return None
                sources[id(value)] = source

        def source_of(value: Any) -> Source:
            if not isinstance(value, _PLAIN) and id(value) in sources:
                return sources[id(value)]
            return ("c", value)

        bound_args, bound_kwargs = bound
        return cls(
            tuple(source_of(v) for v in bound_args),
            tuple((k, source_of(v)) for k, v in bound_kwargs.items()),
            bound_args is args and bound_kwargs is kwargs,
        )

    def apply(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        """The canonical form of a call with the signature this plan was learned from."""
        if self.unchanged:
            return args, kwargs
        return (
            tuple(_pick(source, args, kwargs) for source in self.positional),
            {name: _pick(source, args, kwargs) for name, source in self.keywords},
        )


def _pick(source: Source, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    kind, where = source
    if kind == "a":
        return args[where]
    if kind == "k":
        return kwargs[where]
    return where


def call_signature(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    owned: frozenset[int] | Callable[[], frozenset[int]] = frozenset(),
) -> tuple[Any, ...] | None:
    """A cheap hashable signature of a call, or None when it holds something else.

    Per argument (keywords by name, in the order given): a tensor's dtype and shape, a plain
    constant's type and value, a list or tuple of such, a dict of such by plain keys (in its
    order: Qwen2 and Gemma pass their attention masks by layer type), or a cache object's attributes
    (:func:`~tunetree.hf.caches.is_cache_object`) as such. Two calls with the same signature
    bind alike (:class:`ArgumentPlan`) and have the same :class:`~tunetree.signature.graph.GraphKey`
    (which says the same things, in a form that is slower to build). An object whose id is in
    ``owned`` (state a runner returned and checks itself, see ``Runner.owned_ids``) is keyed by
    its identity: a decode step passing back the cache a device graph returned costs no walk
    over the cache's layers. ``owned`` may be a function giving those ids: it is called only
    when the call holds something other than a tensor (a call of tensors alone asks nothing).
    """
    parts: list[Any] = []
    for value in args:
        if type(value) is torch.Tensor:  # the common case, without a function call
            parts.append((value.dtype, value.shape))
            continue
        if callable(owned):
            owned = owned()
        part = _part(value, owned)
        if part is None:
            return None
        parts.append(part)
    for name, value in kwargs.items():
        if type(value) is torch.Tensor:
            parts.append((name, (value.dtype, value.shape)))
            continue
        if callable(owned):
            owned = owned()
        part = _part(value, owned)
        if part is None:
            return None
        parts.append((name, part))
    return tuple(parts)


def _dict_part(value: dict[Any, Any]) -> Any:
    """A dict's signature: its entries in order, or None when a key is not a plain constant."""
    entries = [(k, _part(v)) for k, v in value.items()]
    if any(type(k) not in _PLAIN or part is None for k, part in entries):
        return None
    return (dict, tuple(entries))


def _part(value: Any, owned: frozenset[int] = frozenset()) -> Any:
    kind = type(value)
    if kind is torch.Tensor:
        return (value.dtype, value.shape)
    if kind in _PLAIN:
        return (kind, value)
    if owned and id(value) in owned:
        return ("owned", id(value))
    if isinstance(value, type):  # a class attribute of a cache (the layer class it makes)
        return (type, value)
    if kind is list or kind is tuple or kind is torch.Size:
        # A torch.Size keys as the tuple of ints it is (GraphKey does the same).
        items = [_part(v) for v in value]
        container = list if kind is list else tuple
        return None if any(i is None for i in items) else (container, tuple(items))
    if kind is dict:  # e.g. a model's attention masks by layer type ({"full_attention": mask})
        return _dict_part(value)
    if isinstance(value, enum.Enum):  # members are singletons: hashable, keyed by value
        return (kind, value)
    if is_cache_class(kind):
        fields = vars(value)
        if fields.get("is_initialized") is False:
            return None  # a fresh layer: the dispatcher initialises it first, then keys it
        names = sorted(fields)
        items = [_part(key_value(fields, k)) for k in names]
        if any(i is None for i in items):
            return None
        return (kind, tuple(zip(names, items, strict=True)))
    if kind is Derived:
        return (kind, value)
    return None
