"""Output structures already known from a real eager call, so loading a runner need not learn them.

Loading a saved runner needs the module's own output structure (:func:`.flat.learn_output_spec`);
from a file alone it is learnt by running the module on fake tensors, which costs torch's
``FakeTensorMode`` and with it an import of Dynamo (seconds, most of a warm start). A caller
that holds eager's real output of the same module on a call of the same key (the tuning cache,
which checks the loaded runner against those outputs anyway) names it with
:func:`outputs_known`; the structure is then taken from it. Outputs holding cache objects keep
the fake run (their structure is what ``generate`` depends on).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.utils._pytree as pytree

from ..signature.graph import GraphKey, flatten
from ..signature.stateful import spec_holds_state

_KNOWN: contextvars.ContextVar[tuple[GraphKey, pytree.TreeSpec] | None] = contextvars.ContextVar(
    "tunetree_known_output", default=None
)


@contextmanager
def outputs_known(key: GraphKey, output: Any) -> Iterator[None]:
    """In the block, ``output`` (eager's, on a call of ``key``) gives ``key``'s structure."""
    try:
        spec = flatten(output)[1]
    except Exception:  # an output pytree cannot describe: learn it as without
        spec = None
    token = _KNOWN.set((key, spec) if spec is not None and not spec_holds_state(spec) else None)
    try:
        yield
    finally:
        _KNOWN.reset(token)


def known_output_spec(key: GraphKey) -> pytree.TreeSpec | None:
    """The structure named for ``key`` by :func:`outputs_known`, or None."""
    known = _KNOWN.get()
    return known[1] if known is not None and known[0] == key else None
