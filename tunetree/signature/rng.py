"""Torch's global random generator when tuning runs beside the threads that serve.

Torch has one global CPU generator (and one per GPU) for the whole process, shared by every
thread. A synchronous tune puts its state back afterwards (:func:`.state.preserved_state`), so
the caller's generator is as it was. A tune running in a background thread must not: putting
the state back would rewind whatever a serving thread drew meanwhile (its next ``dropout``,
``multinomial`` or ``randn`` would repeat earlier numbers). Tunetree's own random inputs use
their own :class:`torch.Generator`, so a background tune draws nothing from the global one as
long as the model's forward draws nothing either; :func:`global_draw` finds a forward that does.

* :func:`rng_left_alone`: in this thread (and what it calls), the global state is neither saved
  nor restored by tunetree.
* :func:`global_draw`: the first random operator a call runs on the global generator, found
  before it draws (so nothing is drawn).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_LEFT_ALONE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tunetree_rng_left_alone", default=False
)


@contextmanager
def rng_left_alone() -> Iterator[None]:
    """Run the block without saving or restoring torch's global random state."""
    token = _LEFT_ALONE.set(True)
    try:
        yield
    finally:
        _LEFT_ALONE.reset(token)


def is_left_alone() -> bool:
    """Whether the global random state is left alone here (see :func:`rng_left_alone`)."""
    return _LEFT_ALONE.get()


class _Drew(Exception):
    """Raised by :class:`_GlobalDraws` before a random operator draws."""


class _GlobalDraws(TorchDispatchMode):
    """Stops at the first seeded random operator given no generator of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.found = ""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Never run under torch.compile: keeps torch from importing Dynamo (seconds) to wrap
        # __torch_dispatch__ on its first call.
        return False

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags and _draws(func, args, kwargs):
            self.found = str(func)
            raise _Drew(self.found)
        return func(*args, **kwargs)


_NO_DRAW = {"dropout_p": 0.0, "train": False, "training": False}
"""Arguments of seeded operators whose value means nothing is drawn (attention without
dropout, a dropout outside training)."""


def _draws(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a seeded operator called so draws from the global generator."""
    values = list(args) + list(kwargs.values())
    if any(isinstance(v, torch.Generator) for v in values):
        return False
    for index, argument in enumerate(func._schema.arguments):
        if argument.name not in _NO_DRAW:
            continue
        if argument.name in kwargs:
            value = kwargs[argument.name]
        elif index < len(args) and not argument.kwarg_only:
            value = args[index]
        else:
            value = argument.default_value if argument.has_default_value() else None
        if value is not None and value == _NO_DRAW[argument.name]:
            return False
    return True


def global_draw(run: Callable[[], Any]) -> str:
    """The first operator ``run()`` would draw from the global generator with; ``""`` if none.

    The call is stopped at that operator, before it draws, so the global state is unchanged.
    An exception ``run`` raises otherwise propagates.
    """
    mode = _GlobalDraws()
    try:
        with torch.no_grad(), mode:
            run()
    except _Drew:
        return mode.found
    except Exception:
        if mode.found:  # the model caught the stop and failed on: it drew nothing
            return mode.found
        raise
    return mode.found
