"""Weight-only compression of OpenVINO matmuls: the integers, their packing, the layout."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

ov = pytest.importorskip("openvino")

from openvino import opset13  # noqa: E402

from tunetree.generation.weights import compress_int4, compress_int8  # noqa: E402

F32 = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
"""f32 compute with activations not quantized on the fly: the weights alone are rounded."""


def _chain(weights: list[tuple[np.ndarray, bool]]) -> object:
    """x -> MatMul(w0) -> MatMul(w1) -> ... (each ``(weight, transpose_b)``)."""
    first, transposed = weights[0]
    width = first.shape[1] if transposed else first.shape[0]
    x = opset13.parameter([2, width], np.float32, name="x")
    node = x
    for weight, transposed in weights:
        node = opset13.matmul(node, opset13.constant(weight), False, transposed)
    return ov.Model([node], [x])


def _run(model: object, x: np.ndarray) -> np.ndarray:
    return ov.Core().compile_model(model, "CPU", F32)(x)[0]


def _dequantized(weight: np.ndarray, axis: int, levels: int) -> np.ndarray:
    """The weight the runtime should compute with: asymmetric rounding along ``axis``."""
    low, high = weight.min(axis=axis, keepdims=True), weight.max(axis=axis, keepdims=True)
    scale = (high - low) / levels
    zero = np.clip(np.round(-low / scale), 0, levels)
    q = np.clip(np.round(weight / scale + zero), 0, levels)
    return (q - zero) * scale


def _groups(weight: np.ndarray, group: int, transposed: bool, levels: int = 15) -> np.ndarray:
    rows, cols = weight.shape
    if transposed:  # [out, in]
        grouped = weight.reshape(rows, cols // group, group)
        return _dequantized(grouped, 2, levels).reshape(rows, cols)
    grouped = weight.reshape(rows // group, group, cols)  # [in, out]
    return _dequantized(grouped, 1, levels).reshape(rows, cols)


def _element_types(model: object) -> Counter[str]:
    return Counter(
        op.get_element_type().get_type_name()
        for op in model.get_ordered_ops()  # type: ignore[attr-defined]
        if op.get_type_name() == "Constant"
    )


@pytest.mark.parametrize("transposed", [True, False])
def test_int4_computes_with_the_grouped_four_bit_weights(transposed: bool) -> None:
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((256, 256)).astype(np.float32)
    w1 = rng.standard_normal((256, 64)).astype(np.float32)  # the last: 8 bits, groups of 64
    model = _chain([(w0, transposed), (w1.T.copy() if transposed else w1, transposed)])
    x = rng.standard_normal((2, 256)).astype(np.float32)
    out = _run(compress_int4(model), x)
    last = _groups(w1.T.copy() if transposed else w1, 64, transposed, levels=255)
    first = _groups(w0, 128, transposed)
    expected = (x @ (first.T if transposed else first)) @ (last.T if transposed else last)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)
    # A packing or grouping mistake would be far off; plain f32 weights are off by the rounding.
    exact = (x @ (w0.T if transposed else w0)) @ w1
    assert np.abs(out - exact).max() > 1e-2


def test_int4_keeps_the_last_matmul_and_ungroupable_weights_at_eight_bits() -> None:
    rng = np.random.default_rng(1)
    model = _chain(
        [
            (rng.standard_normal((64, 128)).astype(np.float32), True),  # 4 bits, groups of 128
            (rng.standard_normal((96, 64)).astype(np.float32), True),  # 64 inputs: groups of 64
            (rng.standard_normal((80, 96)).astype(np.float32), True),  # 96: groups of 32
            (rng.standard_normal((64, 80)).astype(np.float32), True),  # 80: 8 bits
            (rng.standard_normal((64, 64)).astype(np.float32), True),  # the last: 8 bits
        ]
    )
    types = _element_types(compress_int4(model))
    assert types["u4"] == 2 * 3  # weights and zero points of the three grouped ones
    assert types["u8"] == 2 * 2
    assert types["f32"] == 5  # scales only: no float weight left


@pytest.mark.parametrize("transposed", [True, False])
def test_int8_rounds_per_group_of_inputs_and_per_channel_where_they_do_not_divide(
    transposed: bool,
) -> None:
    rng = np.random.default_rng(2)
    grouped = rng.standard_normal((96, 192)).astype(np.float32)  # [out, in]: 3 groups of 64
    ragged = rng.standard_normal((128, 96)).astype(np.float32)  # 96 inputs: per channel
    small = rng.standard_normal((8, 128)).astype(np.float32)  # under MIN_ELEMENTS
    layout = [grouped, ragged, small]
    model = _chain([(w if transposed else w.T.copy(), transposed) for w in layout])
    x = rng.standard_normal((2, 192)).astype(np.float32)
    out = _run(compress_int8(model), x)
    first = _dequantized(grouped.reshape(96, 3, 64), 2, 255).reshape(96, 192)
    expected = (x @ first.T) @ _dequantized(ragged, 1, 255).T @ small.T
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)
    per_channel = (x @ _dequantized(grouped, 1, 255).T) @ _dequantized(ragged, 1, 255).T @ small.T
    assert not np.allclose(out, per_channel, rtol=1e-4, atol=1e-3)  # the groups are real
    assert _element_types(compress_int8(model))["u4"] == 0


def test_compression_leaves_the_given_model_as_it_was() -> None:
    rng = np.random.default_rng(3)
    model = _chain([(rng.standard_normal((128, 128)).astype(np.float32), True)] * 2)
    before = _element_types(model)
    compress_int4(model)
    compress_int8(model)
    assert _element_types(model) == before


def test_int8_rounds_per_channel_when_no_group_is_asked() -> None:
    rng = np.random.default_rng(4)
    weight = rng.standard_normal((96, 192)).astype(np.float32)  # [out, in]: 3 groups of 64
    model = _chain([(weight, True)])
    x = rng.standard_normal((2, 192)).astype(np.float32)
    out = _run(compress_int8(model, group=None), x)
    np.testing.assert_allclose(out, x @ _dequantized(weight, 1, 255).T, rtol=1e-4, atol=1e-3)
    grouped = _dequantized(weight.reshape(96, 3, 64), 2, 255).reshape(96, 192)
    assert not np.allclose(out, x @ grouped.T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("group", [64, None])
def test_int8_half_scales_are_f16_constants_and_compute_the_same_weights(
    group: int | None,
) -> None:
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((96, 192)).astype(np.float32)
    model = _chain([(weight, True), (rng.standard_normal((64, 96)).astype(np.float32), True)])
    half = compress_int8(model, group=group, half_scales=True)
    types = _element_types(half)
    assert types["f16"] == 2 and types["f32"] == 0  # both scales, no f32 scale left
    x = rng.standard_normal((2, 192)).astype(np.float32)
    full = _run(compress_int8(model, group=group), x)
    # f16 weights (11-bit mantissas) against f32 ones: far below the 8-bit rounding itself
    assert np.linalg.norm(_run(half, x) - full) / np.linalg.norm(full) < 2e-3


def _matmul_precisions(model: object) -> Counter[str]:
    """The runtime precision of each matmul the CPU plugin compiled ``model``'s into."""
    runtime = ov.Core().compile_model(model, "CPU", F32).get_runtime_model()
    found: Counter[str] = Counter()
    for op in runtime.get_ordered_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) == "FullyConnected":
            found[info["runtimePrecision"].astype(str)] += 1
    return found


@pytest.mark.parametrize("group", [64, None])
@pytest.mark.parametrize("half", [False, True])
def test_int8_weights_are_compressed_matmuls_for_the_cpu_plugin(
    group: int | None, half: bool
) -> None:
    # Decompressed weights the plugin folds into f32 constants read 4x the bytes: groups with
    # f16 scales converted to f32 before the reshape were (2.2x slower per token).
    rng = np.random.default_rng(6)
    model = _chain([(rng.standard_normal((96, 192)).astype(np.float32), True)])
    assert _matmul_precisions(compress_int8(model, group=group, half_scales=half)) == {"u8": 1}
    assert _matmul_precisions(model) == {"f32": 1}
