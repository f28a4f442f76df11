"""Declared dimensions: resolved against the first call, and the calls that reach their ends.

A torch.export-style ``dynamic_shapes`` nest declares the root's inputs or, with ``call=``
(``generate``, a pipeline), the call's own (a prompt's ids and mask). The model is then run,
unrecorded, at the envelope's ends so every module records the sizes it sees there
(:mod:`.inspection` keeps those calls apart, as probes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from torch import nn

from ..errors import InvalidInputError
from .graph import Dim, GraphKey, Sample
from .modules import CallFn
from .shapes import (
    AxisRef,
    DynamicShapes,
    declared_axes,
    largest,
    probe_sizes,
    ranged_key,
    resize,
)


def declared_dims(
    model: Any,
    spec: DynamicShapes,
    samples: list[Sample],
    call: CallFn | None,
    root_calls: list[Sample],
    parameters: Sequence[str],
) -> dict[AxisRef, Dim]:
    """The declared dimensions, resolved against the first call.

    Without ``call`` they are the root's inputs, resolved against its first recorded call
    (``parameters``: its forward's names). With ``call`` they are the call's own inputs:
    named as the call's keywords, or by position.
    """
    if spec is None or spec is False:
        return {}
    if call is not None:
        return declared_axes(spec, samples[0])
    if not isinstance(model, nn.Module) or not root_calls:
        raise InvalidInputError(
            "dynamic_shapes declares the inputs of the model's forward: it needs an "
            "nn.Module called directly, or call= (whose own inputs it then declares)"
        )
    return declared_axes(spec, root_calls[0], parameters)


def probe_calls(
    declared: dict[AxisRef, Dim],
    samples: list[Sample],
    call: CallFn | None,
    root_calls: list[Sample],
    root_items: list[int],
) -> Iterator[Sample]:
    """The calls to run at the declared ranges' ends and an odd size in between, one at a time.

    Without ``call``, the root's largest recorded call of each pattern, resized. With
    ``call``, the call's own inputs (``samples``) resized to the envelope's corners
    (:func:`corners`: a ``generate`` of the longest prompt at the largest batch, ...), so a
    step's cache reaches what such a prompt brings; ``root_items`` (the dataset item of each
    of ``root_calls``) picks the items to resize (:func:`call_bases`).
    """
    calls = root_calls if call is None else samples
    patterns: dict[GraphKey, list[Sample]] = {}
    for sample in calls:
        patterns.setdefault(sample.key.pattern(), []).append(sample)
    bases = call_bases(samples, root_calls, root_items) if call is not None else []
    for group in patterns.values():
        key = ranged_key([s.key for s in group], declared)
        if call is None:
            for sizes in probe_sizes(key):
                yield resize(largest(group), key, sizes)
            continue
        for base in (b for b in bases if any(b is s for s in group)):
            for sizes in corners(key):
                yield resize(base, key, sizes)


def call_bases(
    samples: list[Sample], root_calls: list[Sample], root_items: list[int]
) -> list[Sample]:
    """The dataset items a call's probes resize: per pattern of the root's calls, the largest.

    Calls of one shape can reach the model as different graphs by their values (``generate``
    drops an all-ones attention mask, so an unpadded prompt's steps take no mask): resizing
    only the largest item would widen the graphs of its values alone.
    """
    made: dict[GraphKey, set[int]] = {}
    for sample, item in zip(root_calls, root_items, strict=True):
        made.setdefault(sample.key.pattern(), set()).add(item)
    bases: list[Sample] = []
    for items in made.values():
        base = largest([samples[i] for i in sorted(items)])
        if not any(base is b for b in bases):
            bases.append(base)
    return bases or [largest(samples)]


def corners(key: GraphKey) -> list[dict[str, int]]:
    """:func:`~.shapes.probe_sizes`, and each dimension at its minimum, the others at their maximum.

    A call's inputs reach its modules through code that may treat the smallest call apart
    (``generate`` drops the all-ones mask of an unpadded batch of one, so that call takes
    another graph): the shortest prompt is also probed at the largest batch, whose padded rows
    keep its mask, so the graph of the tuning prompts reaches the shortest length too.
    """
    sizes = probe_sizes(key)
    dims = key.dims()
    for name, dim in dims.items():
        # A size of 1 keys apart (a broadcast, a decode step's shape): 2 reaches the range's end.
        for low in sorted({dim.min, min(2, dim.max)}):
            corner = {n: (low if n == name else d.max) for n, d in dims.items()}
            if corner not in sizes:
                sizes.append(corner)
    return sizes
