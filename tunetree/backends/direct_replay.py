"""A capture's replay with nothing around it, for calls already matched to that capture.

A dispatcher remembers, per call signature (each tensor's dtype and shape, each constant's
value, see :func:`~tunetree.signature.binding.call_signature`), which capture served it. A
later call with that signature needs none of the checks a device-graph runner makes on an
arbitrary call (which capture, whether a cache is passed back, whether each input fits): the
signature already says that every tensor fits its static buffer. So it is served the way a
user serves a CUDA graph by hand: copy each tensor in, replay, clone the output. On a small
model that is nearly all the host's work per call, so the runner's checks would be a visible
share of it (``benchmarks/serving.py`` compares it with a capture driven by hand).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

_CREATING = threading.Lock()


def serial_lock(owner: Any) -> Any:
    """``owner``'s ``serial`` lock (an RLock), made on first use when it has none.

    A CUDA graph's static buffers (and a memory pool captures share) serve one call at a
    time: calls from several threads hold this lock from the copy in to the outputs out.
    """
    lock = owner.__dict__.get("serial")
    if lock is None:
        with _CREATING:
            lock = owner.__dict__.setdefault("serial", threading.RLock())
    return lock


def serialised(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` called under its object's :func:`serial_lock`."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with serial_lock(self):
            return method(self, *args, **kwargs)

    return locked


class DirectReplay:
    """Copy in, replay, hand the outputs back: for calls whose signature matched the capture.

    Only a dispatcher that keys calls by signature may call it (the tensors' shapes and dtypes
    are not checked again). ``slots`` say where each static buffer's value sits in the call
    (a position or a keyword's name); ``graph`` is the capture's graph; ``output`` gives the
    caller its outputs (clones, or the updated input state, as the capture's own call does).
    """

    __slots__ = ("_graph", "_keywords", "_output", "_positional", "_serial", "capture")

    def __init__(
        self,
        capture: Any,
        slots: list[tuple[int | str, torch.Tensor]],
        graph: Any,
        output: Callable[[], Any],
        serial: Any,
    ) -> None:
        self.capture = capture
        """The capture this replays (what a table or a test names as serving the call)."""
        self._positional = [(where, t) for where, t in slots if isinstance(where, int)]
        self._keywords = [(where, t) for where, t in slots if isinstance(where, str)]
        self._graph = graph
        self._output = output
        self._serial = serial
        """The capture's lock: calls from several threads replay one at a time."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Serve one call of the signature this replay was made for."""
        with self._serial:
            for i, static in self._positional:
                static.copy_(args[i])
            for name, static in self._keywords:
                static.copy_(kwargs[name])
            self._graph.replay()
            return self._output()

    def __repr__(self) -> str:
        return f"DirectReplay({self.capture!r})"
