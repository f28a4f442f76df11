"""``torch.export`` of a flat graph over its ranges, retried where torch cannot prove a guard.

A graph's ranges are exported as named ``torch.export.Dim`` with their min and max. Some
models compute sizes that torch's symbolic reasoning cannot bound although every value of the
range satisfies them: SpeechT5's decoder steps guard on ``min(16 + 16*d, 64 + 64*d) ==
16 + 16*d`` over the cache's length ``d``, and ``torch.export`` refuses ("Constraints violated
... not all values of d in the specified range satisfy the generated guard"). The export is
then tried once more with the same axes as ``Dim.DYNAMIC``, which records such guards instead
of refusing (it still refuses code that fixes an axis to one size). Either way the runner is
checked against eager at the ranges' ends before it serves, like every candidate.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..signature.graph import GraphKey
from .ranges import axis_dims, export_dynamic_shapes

log = logging.getLogger(__name__)

_CONSTRAINTS_VIOLATED = "Constraints violated"


def export_ranged(module: nn.Module, example: tuple[torch.Tensor, ...], key: GraphKey) -> Any:
    """``torch.export.export(module, example)`` over ``key``'s ranges (an ``ExportedProgram``).

    Raises what ``torch.export`` raises, except a guard over a range it cannot prove (retried
    with unnamed dynamic axes; that export still refuses an axis the code fixes to one size).
    """
    try:
        return torch.export.export(module, example, dynamic_shapes=export_dynamic_shapes(key))
    except Exception as error:
        if _CONSTRAINTS_VIOLATED not in str(error):
            raise
        log.debug("named ranges refused (%s); exporting with unnamed dynamic axes", error)
    return torch.export.export(module, example, dynamic_shapes=relaxed_dynamic_shapes(key))


def relaxed_dynamic_shapes(key: GraphKey) -> tuple[tuple[dict[int, Any], ...]] | None:
    """The axes of :func:`export_dynamic_shapes` as ``Dim.DYNAMIC`` (no names, no bounds)."""
    if not key.is_dynamic:
        return None
    dynamic = torch.export.Dim.DYNAMIC
    return (tuple({axis: dynamic for axis in axes} for axes in axis_dims(key)),)
