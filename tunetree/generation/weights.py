"""Weight-only compression of an OpenVINO model's matmuls (8 or 4 bits), with OpenVINO's own ops.

Every ``MatMul`` whose weight is a float constant (at least :data:`MIN_ELEMENTS` of them) gets
its weight as unsigned integers with a zero point and a scale, decompressed in the graph
(``Constant(u8|u4) -> Convert -> Subtract -> Multiply [-> Reshape]``, with f16 scales
``... -> Multiply [-> Reshape] -> Convert(f32)``): the patterns OpenVINO's CPU plugin runs as
compressed-weight matmuls, the ones weight-compression tools (NNCF) write.

- ``int8``: 8 bits in groups of :data:`INT8_GROUP` inputs, a scale and zero point per group
  (per output channel where the inputs do not divide into groups). Groups keep a 0.5B model's
  teacher-forced logit error a fifth to a quarter below per-channel scales, at the same speed
  (docs/measurements.md).
- ``int4``: 4 bits in groups of inputs (the largest of :data:`GROUPS` that divides the
  weight's inputs), a scale and zero point per group. The last matmul (the LM head, whose
  errors reach the logits undamped) and any weight whose inputs divide into none of them stay
  at 8 bits, as weight-compression tools do.

Results change (the weights are rounded), so both are offered only under an accuracy budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

MIN_ELEMENTS = 4096
"""Smaller weights stay as they are (their bytes do not matter)."""
GROUPS = (128, 64, 32)
"""Inputs that may share one 4-bit scale and zero point, the preferred size first."""
INT8_GROUP = 64
"""Inputs that share one 8-bit scale and zero point."""


def compress_int8(model: Any, *, group: int | None = INT8_GROUP, half_scales: bool = False) -> Any:
    """A copy of ``model`` with its matmul weights in 8 bits (asymmetric, per group of inputs).

    ``group=None`` rounds per output channel; ``half_scales`` keeps the scales in f16 (the
    weight is decompressed in f16, then converted to f32, as NNCF does), half their bytes.
    """
    model = model.clone()
    for op, weight, axis in list(_weight_matmuls(model)):
        op.input(1).replace_source_output(_int8(weight, axis, group, half_scales))
    model.validate_nodes_and_infer_types()
    return model


def compress_int4(model: Any) -> Any:
    """A copy of ``model`` with its matmul weights in 4 bits per group of inputs.

    The last matmul and weights whose input count divides into none of :data:`GROUPS` get
    8 bits per channel instead (see the module's docstring).
    """
    model = model.clone()
    found = list(_weight_matmuls(model))
    for index, (op, weight, axis) in enumerate(found):
        group = next((g for g in GROUPS if weight.shape[axis] % g == 0), None)
        last = index == len(found) - 1
        node = _int8(weight, axis) if group is None or last else _int4(weight, axis, group)
        op.input(1).replace_source_output(node)
    model.validate_nodes_and_infer_types()
    return model


def _weight_matmuls(model: Any) -> Iterator[tuple[Any, np.ndarray, int]]:
    """``(matmul, weight, reduced axis)`` for each matmul with a large float32 constant weight."""
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        source = op.input_value(1).get_node()
        if source.get_type_name() != "Constant":
            continue
        weight = source.get_data()
        if weight.ndim != 2 or weight.size < MIN_ELEMENTS or weight.dtype != np.float32:
            continue
        yield op, weight, 1 if op.get_attributes().get("transpose_b", False) else 0


def _quantize(weight: np.ndarray, axis: int, levels: int) -> tuple[np.ndarray, ...]:
    """Asymmetric rounding along ``axis``: integer weights, zero points and scales."""
    low = weight.min(axis=axis, keepdims=True)
    high = weight.max(axis=axis, keepdims=True)
    scale = ((high - low) / levels).astype(np.float32)
    scale[scale == 0] = 1.0
    zero = np.clip(np.round(-low / scale), 0, levels)
    quantized = np.clip(np.round(weight / scale + zero), 0, levels).astype(np.uint8)
    return quantized, zero.astype(np.uint8), scale


def _decompressed(
    quantized: Any, zero: Any, scale: np.ndarray, half: bool = False, shape: Any = None
) -> Any:
    """``(quantized - zero) * scale`` in f32 from integer constants: the decompression pattern.

    ``shape`` reshapes the groups to the weight's shape. With ``half``, computed in f16 from an
    f16 scale, reshaped, and only then converted to f32: NNCF's order, the one OpenVINO's CPU
    plugin fuses into a compressed matmul (a reshape after the convert is folded instead, the
    matmul reading f32 weights).
    """
    import openvino
    from openvino import opset13

    kind = openvino.Type.f16 if half else openvino.Type.f32
    node = opset13.multiply(
        opset13.subtract(opset13.convert(quantized, kind), opset13.convert(zero, kind)),
        opset13.constant(scale.astype(np.float16) if half else scale),
    )
    if shape is not None:
        node = opset13.reshape(node, np.array(shape, dtype=np.int64), False)
    return opset13.convert(node, openvino.Type.f32) if half else node


def _int8(weight: np.ndarray, axis: int, group: int | None = INT8_GROUP, half: bool = False) -> Any:
    """The decompression subgraph of ``weight`` in 8 bits per ``group`` inputs (or channel)."""
    from openvino import opset13

    if group is None or weight.shape[axis] % group:
        quantized, zero, scale = _quantize(weight, axis, 255)
        constants = opset13.constant(quantized), opset13.constant(zero)
        return _decompressed(*constants, scale, half).output(0)
    return _grouped(weight, axis, group, 255, opset13.constant, half)


def _int4(weight: np.ndarray, axis: int, group: int) -> Any:
    """The decompression subgraph of ``weight`` in 4 bits per group along ``axis``."""
    return _grouped(weight, axis, group, 15, _u4_constant)


def _grouped(
    weight: np.ndarray,
    axis: int,
    group: int,
    levels: int,
    constant: Callable[[Any], Any],
    half: bool = False,
) -> Any:
    """``weight`` rounded to ``levels`` per ``group`` inputs along ``axis``, decompressed."""
    rows, cols = weight.shape
    if axis == 1:  # [out, in]: groups of inputs along the last axis
        grouped = weight.reshape(rows, cols // group, group)
        reduced = 2
    else:  # [in, out]: groups of inputs along the first axis
        grouped = weight.reshape(rows // group, group, cols)
        reduced = 1
    quantized, zero, scale = _quantize(grouped, reduced, levels)
    return _decompressed(constant(quantized), constant(zero), scale, half, (rows, cols)).output(0)


def _u4_constant(values: np.ndarray) -> Any:
    """An OpenVINO ``u4`` constant of ``values`` (each 0..15), packed two to a byte."""
    import openvino

    flat = values.reshape(-1).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    packed = np.ascontiguousarray(flat[0::2] | (flat[1::2] << 4))
    # The tensor wraps ``packed``'s memory: the constant must copy it, since ``packed`` dies here.
    tensor = openvino.Tensor(packed, openvino.Shape(list(values.shape)), openvino.Type.u4)
    return openvino.op.Constant(tensor, shared_memory=False)
