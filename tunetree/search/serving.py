"""Which tuned graphs their dispatchers really serve.

A graph is tuned from the calls the inspection recorded, but a wrapped module is served by
the key of each live call. Where the two differ (an argument recorded in another form than it
is passed, an object made anew on every call), the dispatcher never routes a call to the
graph's runner, and the graph's measured speed-up would describe nothing the model does.
:func:`mark_unserved` reads which graphs each dispatcher served while the tuned model ran the
tuning data (``Dispatcher.served``) and marks the others, so no table reports them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..candidates.results import GraphResult
from ..runtime.wrap import dispatcher_of
from ..signature.inspection import ModelInfo
from ..signature.modules import CallFn, find_module, run_model

log = logging.getLogger(__name__)


def mark_unserved(model: Any, graphs: list[GraphResult]) -> list[GraphResult]:
    """Mark each graph whose winner no call of ``model`` reached (``never_served``).

    ``model`` is the tuned model after it ran the tuning data. Returns the graphs marked and
    logs one warning naming the first of them.
    """
    found = []
    for graph in graphs:
        if graph.winner is None or graph.winner.runner is None:
            continue
        try:
            module = find_module(model, graph.path)
        except Exception:  # a pipeline's path not reachable from this object: nothing to say
            continue
        dispatcher = dispatcher_of(module)
        if dispatcher is None:
            continue
        graph.never_served = graph.graph.key not in dispatcher.served
        if graph.never_served:
            found.append(graph)
    if found:
        first = found[0]
        log.warning(
            "%d tuned graph%s never served a call of the tuning data (e.g. %s %s): the calls "
            "are keyed otherwise and run the original forward, so no speed-up is reported for "
            "%s",
            len(found),
            "s" if len(found) > 1 else "",
            first.path or "<model>",
            first.graph.key,
            "it" if len(found) == 1 else "them",
        )
    return found


def serve_once(model: Any, info: ModelInfo, call: CallFn | None) -> None:
    """Run the tuned ``model`` on the tuning data once, so its dispatchers route every call."""
    with torch.no_grad():
        for sample in info.samples:
            try:
                run_model(model, sample, call)
            except Exception as exc:  # a check, not the tune: the runners were checked before
                log.debug("serving check: the tuned model failed on a tuning call: %s", exc)
                return
