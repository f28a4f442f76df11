"""Shape a stateful model's graph so OpenVINO's CPU plugin fuses its attention and rotary embedding.

The CPU plugin keeps a ``ScaledDotProductAttention`` whole only where it can take the KV
cache's update in with it (its stateful SDPA kernel, the cache held in the kernel's own layout
and appended in place). It looks for a state read, a ``Gather`` of the state's rows along the
batch axis (the beam reorder of a beam search), the concatenation with the step's keys or
values, and the attention (with or without repeated key/value heads before it); an attention it
does not find so in a stateful model is split into matmuls and a softmax, and the concatenation
copies the whole cache every step. make-stateful leaves the state read feeding the
concatenation directly, so :func:`gather_state_rows` puts that ``Gather`` in, selecting the rows
in order (``0 .. batch - 1``, from ``input_ids``' shape): the same values, no new input.

The plugin fuses the rotary embedding (``x * cos + rotate_half(x) * sin``) where
``rotate_half``'s negation is a multiplication by a constant; the converter writes it as a
conversion of an integer constant that it marks as not to be folded, and the pattern does not
see through it. :func:`fold_scalar_converts` replaces each conversion of a one-element constant
by the converted constant, where the value converts exactly.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

_FLOATS = ("f16", "f32", "f64")


def gather_state_rows(model: Any, input_name: str = "input_ids") -> int:
    """Put an in-order row ``Gather`` between each state read and the concatenation it feeds.

    Args:
        model: a stateful ``openvino.Model`` whose states are ``[batch, ...]`` tensors.
        input_name: the input whose first dimension is the batch.

    Returns:
        How many state reads got the gather.
    """
    from openvino import opset13

    shape = opset13.shape_of(model.input(input_name), output_type="i32")
    batch = opset13.gather(shape, opset13.constant(np.int32(0)), opset13.constant(np.int32(0)))
    rows = opset13.range(
        opset13.constant(np.int32(0)), batch, opset13.constant(np.int32(1)), output_type="i32"
    )
    axis = opset13.constant(np.int64(0))
    done = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "ReadValue":
            continue
        concats = [
            target
            for target in op.output(0).get_target_inputs()
            if target.get_node().get_type_name() == "Concat"
        ]
        if not concats:
            continue
        gathered = opset13.gather(op.output(0), rows, axis)
        gathered.set_friendly_name(f"{op.get_friendly_name()}/rows")
        for target in concats:
            target.replace_source_output(gathered.output(0))
        done += 1
    model.validate_nodes_and_infer_types()
    log.debug("stateful export: %d state reads gathered by rows in order", done)
    return done


def fold_scalar_converts(model: Any) -> int:
    """Replace each floating conversion of a one-element constant by the converted constant.

    Only where the value converts exactly (converted back it is the same), so the model
    computes what it computed.

    Args:
        model: an ``openvino.Model``.

    Returns:
        How many conversions were folded.
    """
    from openvino import opset13

    done = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Convert":
            continue
        source = op.input_value(0).get_node()
        target_type = op.get_output_element_type(0)
        if source.get_type_name() != "Constant" or target_type.get_type_name() not in _FLOATS:
            continue
        value = np.asarray(source.get_data())
        if value.size != 1:
            continue
        converted = value.astype(target_type.to_dtype())
        if not np.array_equal(converted.astype(value.dtype), value):
            continue
        constant = opset13.constant(converted)
        constant.set_friendly_name(op.get_friendly_name())
        op.output(0).replace(constant.output(0))
        done += 1
    model.validate_nodes_and_infer_types()
    log.debug("stateful export: %d one-element constant conversions folded", done)
    return done
