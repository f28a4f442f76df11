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

from collections.abc import Callable
from typing import Any

import torch


class DirectReplay:
    """Copy in, replay, hand the outputs back: for calls whose signature matched the capture.

    Only a dispatcher that keys calls by signature may call it (the tensors' shapes and dtypes
    are not checked again). ``slots`` say where each static buffer's value sits in the call
    (a position or a keyword's name); ``graph`` is the capture's graph; ``output`` gives the
    caller its outputs (clones, or the updated input state, as the capture's own call does).
    """

    __slots__ = ("_graph", "_keywords", "_output", "_positional", "capture")

    def __init__(
        self,
        capture: Any,
        slots: list[tuple[int | str, torch.Tensor]],
        graph: Any,
        output: Callable[[], Any],
    ) -> None:
        self.capture = capture
        """The capture this replays (what a table or a test names as serving the call)."""
        self._positional = [(where, t) for where, t in slots if isinstance(where, int)]
        self._keywords = [(where, t) for where, t in slots if isinstance(where, str)]
        self._graph = graph
        self._output = output

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Serve one call of the signature this replay was made for."""
        for i, static in self._positional:
            static.copy_(args[i])
        for name, static in self._keywords:
            static.copy_(kwargs[name])
        self._graph.replay()
        return self._output()

    def __repr__(self) -> str:
        return f"DirectReplay({self.capture!r})"
