"""What a saved ONNX model holds, read without ONNX Runtime: external data and precision.

Both come from a file, so both are read from the content, never from the record:

* **External data.** A tensor's bytes may live in another file named inside the model. Every
  place a tensor can sit is scanned (initializers and sparse initializers of every graph and
  subgraph, node attributes ``t``, ``tensors``, ``sparse_tensor``, ``sparse_tensors`` such as
  a ``Constant``'s ``sparse_value``, and the nodes of the model's functions), and each named
  file must be one of the runner's own.
* **Precision.** A model quantized (``MatMulInteger``, ``QLinear*``, ``DequantizeLinear`` ...)
  or holding reduced-precision floats its inputs and outputs do not carry changes results,
  whatever its record's kind says.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import BackendError

_QUANTIZED_OPS = frozenset(
    {
        "MatMulInteger",
        "ConvInteger",
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "DynamicQuantizeMatMul",
        "DynamicQuantizeLSTM",
        "MatMulIntegerToFloat",
        "MatMulNBits",
        "MatMulBnb4",
        "GatherBlockQuantized",
        "QAttention",
        "QGemm",
        "QEmbedLayerNormalization",
        "QOrderedMatMul",
        "QOrderedAttention",
        "QOrderedLayerNormalization",
        "QOrderedLongformerAttention",
        "QOrderedGelu",
    }
)
"""Node types that compute on quantized values (standard and ONNX Runtime contrib ops);
``QLinear*`` ops are matched by their prefix."""

_REDUCED_FLOATS = {
    10: "float16",
    16: "bfloat16",
    17: "float8e4m3fn",
    18: "float8e4m3fnuz",
    19: "float8e5m2",
    20: "float8e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4e2m1",
}
"""ONNX element types (``TensorProto.DataType``) narrower than a float32 model computes in."""

_EXTERNAL = 1
"""``TensorProto.DataLocation.EXTERNAL``."""


def _subgraphs(nodes: Any) -> Iterator[Any]:
    """Every graph that ``nodes``' attributes hold, and every subgraph below those."""
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _graphs(attribute.g)
            for sub in attribute.graphs:
                yield from _graphs(sub)


def _graphs(graph: Any) -> Iterator[Any]:
    """``graph`` and every subgraph below it."""
    yield graph
    yield from _subgraphs(graph.node)


def all_nodes(model: Any) -> Iterator[Any]:
    """Every node of the model: its graph, subgraphs, and its functions' bodies."""
    for graph in _graphs(model.graph):
        yield from graph.node
    for function in model.functions:
        yield from function.node
        for graph in _subgraphs(function.node):
            yield from graph.node


def _sparse(sparse: Any) -> Iterator[Any]:
    yield sparse.values
    yield sparse.indices


def all_tensors(model: Any) -> Iterator[Any]:
    """Every tensor the model holds, wherever it sits (see the module docstring)."""
    for graph in _graphs(model.graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from _sparse(sparse)
    for node in all_nodes(model):
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("sparse_tensor"):
                yield from _sparse(attribute.sparse_tensor)
            for sparse in attribute.sparse_tensors:
                yield from _sparse(sparse)


def check_external_data(model: Any, files: set[str]) -> None:
    """Refuse a model naming external data outside ``files`` (BackendError).

    A tensor marked as external without a file name is refused too.
    """
    for tensor in all_tensors(model):
        locations = [e.value for e in tensor.external_data if e.key == "location"]
        if tensor.data_location == _EXTERNAL and not locations:
            raise BackendError(
                f"saved ONNX model marks tensor {tensor.name[:80]!r} as external data without "
                "naming its file"
            )
        for location in locations:
            if location not in files:
                raise BackendError(
                    f"saved ONNX model names external data {location[:80]!r}, not one of "
                    "the runner's own files: refusing to read outside the checkpoint"
                )


def _carried(model: Any) -> set[int]:
    """Element types the graph's inputs and outputs declare."""
    ports = [*model.graph.input, *model.graph.output]
    return {p.type.tensor_type.elem_type for p in ports if p.type.HasField("tensor_type")}


def reduced_precision(model: Any) -> str | None:
    """What in the model computes below its inputs' and outputs' precision, or None.

    A quantized node, a tensor of a reduced type (float16, bfloat16, float8, int4 ...) or a
    ``Cast`` to one, where the graph's inputs and outputs carry no such type.
    """
    carried = _carried(model)
    for node in all_nodes(model):
        op = node.op_type
        if op in _QUANTIZED_OPS or op.startswith("QLinear"):
            return f"holds quantized nodes ({op})"
        if op == "Cast":
            for attribute in node.attribute:
                reduced = attribute.i in _REDUCED_FLOATS and attribute.i not in carried
                if attribute.name == "to" and reduced:
                    return f"casts to {_REDUCED_FLOATS[attribute.i]}"
    for tensor in all_tensors(model):
        if tensor.data_type in _REDUCED_FLOATS and tensor.data_type not in carried:
            return f"holds {_REDUCED_FLOATS[tensor.data_type]} tensors ({tensor.name[:60]!r})"
    return None


def refused_by_onnxruntime(exc: BaseException) -> str:
    """The message of a session ONNX Runtime refused to open on a saved model."""
    return f"ONNX Runtime refuses the saved model: {str(exc).strip()[:300]}"
