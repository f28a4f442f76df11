"""8-bit weight-only compression of an OpenVINO model's matmuls, with OpenVINO's own ops.

Every ``MatMul`` whose weight is a float constant (at least :data:`MIN_ELEMENTS` of them) gets
the weight as unsigned 8-bit integers with a zero point and a scale per output channel,
decompressed in the graph (``Constant(u8) -> Convert -> Subtract -> Multiply``): the pattern
OpenVINO's CPU plugin runs as int8-weight matmuls, the one weight-compression tools write.
Results change (the weights are rounded), so this is offered only under an accuracy budget.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MIN_ELEMENTS = 4096
"""Smaller weights stay as they are (their bytes do not matter)."""


def compress_int8(model: Any) -> Any:
    """A copy of ``model`` with its matmul weights in 8 bits (asymmetric, per channel)."""
    import openvino
    from openvino import opset13

    model = model.clone()
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        source = op.input_value(1).get_node()
        if source.get_type_name() != "Constant":
            continue
        weight = source.get_data()
        if weight.ndim != 2 or weight.size < MIN_ELEMENTS or weight.dtype != np.float32:
            continue
        axis = 1 if op.get_attributes().get("transpose_b", False) else 0
        low = weight.min(axis=axis, keepdims=True)
        high = weight.max(axis=axis, keepdims=True)
        scale = ((high - low) / 255.0).astype(np.float32)
        scale[scale == 0] = 1.0
        zero = np.clip(np.round(-low / scale), 0, 255)
        quantized = np.clip(np.round(weight / scale + zero), 0, 255).astype(np.uint8)
        decompressed = opset13.multiply(
            opset13.subtract(
                opset13.convert(opset13.constant(quantized), openvino.Type.f32),
                opset13.convert(opset13.constant(zero.astype(np.uint8)), openvino.Type.f32),
            ),
            opset13.constant(scale),
        )
        op.input(1).replace_source_output(decompressed.output(0))
    model.validate_nodes_and_infer_types()
    return model
