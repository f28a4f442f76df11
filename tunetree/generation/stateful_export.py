"""A Hugging Face causal LM's whole forward as one stateful OpenVINO model.

The exported forward takes ``input_ids``, ``attention_mask``, ``position_ids`` and
``logit_positions`` (the positions whose logits are wanted: ``generate`` asks for the last one
only, so a prefill projects one row per sequence onto the vocabulary, not every prompt
position) and returns those logits; its KV cache is not an input or output but OpenVINO
*state*: each past key/value input is paired with the present key/value output it becomes
(OpenVINO's make-stateful transformation), so the cache stays inside the infer request
between steps. The state's initial value is an empty ``[batch, kv_heads, 0, head_dim]`` tensor
of the call's batch (read from ``input_ids``), so a reset request starts a prefill of any
batch. The graph is then put in the forms OpenVINO's CPU plugin fuses
(:mod:`tunetree.generation.stateful_fusion`): attention with the cache update in one kernel,
and the rotary embedding.

Grouped-query attention is written as attention over repeated key/value heads, and a query
row that its mask hides entirely (a left-padded prompt's padding) gives eager's zeros
(:func:`attention_for_runtime`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from ..backends.export_context import describe_error, exporting, quiet
from ..backends.openvino import load_openvino, private_home
from ..errors import BackendError
from .stateful_fusion import fold_scalar_converts, gather_state_rows

log = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask", "position_ids", "logit_positions")
"""The stateful model's inputs, in port order; ``logits`` is its one output."""
LOGITS = "logits"


@dataclasses.dataclass(frozen=True)
class CacheShape:
    """What one layer of the model's KV cache holds per position: heads and head size."""

    layers: int
    kv_heads: tuple[int, ...]
    head_dims: tuple[int, ...]
    sliding: tuple[bool, ...]
    dtype: torch.dtype


def output_cache(output: Any) -> Any:
    """The cache a Hugging Face model output carries (``cache`` or ``past_key_values``)."""
    for name in ("cache", "past_key_values"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    return None


class _WholeForward(nn.Module):
    """The causal LM's forward with its cache as flat tensors in and out (for export only)."""

    def __init__(self, model: nn.Module, layers: int) -> None:
        super().__init__()
        self.model = model
        self.layers = layers
        # Where the model slices its hidden states before the LM head (transformers'
        # ``logits_to_keep``, here a tensor of positions), only the kept rows are projected.
        self.slices = "logits_to_keep" in inspect.signature(model.forward).parameters

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        logit_positions: torch.Tensor,
        past: tuple[torch.Tensor, ...],
    ) -> tuple[torch.Tensor, ...]:
        from transformers.cache_utils import DynamicCache, DynamicLayer

        cache = DynamicCache()
        cache.layers = []
        for i in range(self.layers):
            # Full layers even where the model slides a window: the runner serves no call
            # past the window, inside which both hold and attend to the same positions.
            layer = DynamicLayer()
            layer.keys, layer.values = past[2 * i], past[2 * i + 1]
            layer.is_initialized, layer.device = True, past[0].device
            layer.dtype = past[0].dtype  # type: ignore[attr-defined]
            cache.layers.append(layer)
        keep = {"logits_to_keep": logit_positions} if self.slices else {}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
            **keep,
        )
        logits = out.logits if self.slices else out.logits.index_select(1, logit_positions)
        present = output_cache(out)
        flat = [t for layer in present.layers for t in (layer.keys, layer.values)]
        return (logits, *flat)


def export_stateful(model: nn.Module, shape: CacheShape) -> Any:
    """``model``'s forward as a stateful OpenVINO model (see the module's docstring).

    Raises:
        BackendError: the export or the conversion failed (the reason is in the message).
    """
    openvino = load_openvino()
    device = torch.device("cpu")
    batch, length, past = 2, 3, 4
    ids = torch.zeros(batch, length, dtype=torch.long, device=device)
    mask = torch.ones(batch, past + length, dtype=torch.long, device=device)
    positions = torch.arange(past, past + length, device=device).expand(batch, length)
    # Fewer kept positions than ids in the example, so export does not tie the two sizes.
    kept = torch.arange(1, length, device=device)
    flat = tuple(
        torch.zeros(batch, heads, past, size, dtype=shape.dtype, device=device)
        for heads, size in zip(shape.kv_heads, shape.head_dims, strict=True)
        for _ in range(2)
    )
    dynamic = torch.export.Dim.DYNAMIC
    dims = (
        {0: dynamic, 1: dynamic},
        {0: dynamic, 1: dynamic},
        {0: dynamic, 1: dynamic},
        {0: dynamic},
        tuple({0: dynamic, 2: dynamic} for _ in flat),
    )
    wrapper = _WholeForward(model, shape.layers)
    try:
        with exporting(model), attention_for_runtime(), quiet():
            exported = torch.export.export(
                wrapper, (ids, mask, positions, kept, flat), dynamic_shapes=dims, strict=False
            )
            drop_identity_reshapes(exported)
            with private_home():
                converted = openvino.convert_model(exported)
    except Exception as exc:
        raise BackendError(f"the whole forward did not export: {describe_error(exc)}") from exc
    _make_stateful(converted, shape)
    return converted


def drop_identity_reshapes(exported: Any) -> int:
    """Remove each ``reshape``/``view`` whose output has its input's shape; how many went.

    Such a reshape computes nothing (transformers reshapes attention's output to the shape it
    has, :func:`attention_for_runtime` the query to name its head count), but OpenVINO keeps
    each as a node whose target shape it recomputes on every call of dynamic shape: two per
    layer on each decode step. Shapes are compared as exported (sizes, or the same symbolic
    expression), so a reshape stays wherever the two could differ on some input.
    """
    reshapes = (torch.ops.aten.reshape.default, torch.ops.aten.view.default)
    graph = exported.graph_module.graph
    dropped = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in reshapes:
            continue
        if any(user.op == "output" for user in node.users):
            continue  # the exported program's signature names its outputs
        source = node.args[0]
        before, after = _shape_of(source), _shape_of(node)
        if before is not None and before == after:
            node.replace_all_uses_with(source)
            graph.erase_node(node)
            dropped += 1
    if dropped:
        exported.graph_module.recompile()
    return dropped


def _shape_of(node: Any) -> tuple[Any, ...] | None:
    """A node's exported shape as sizes and symbolic expressions, or None if unknown."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    return tuple(d.node.expr if isinstance(d, torch.SymInt) else int(d) for d in value.shape)


@contextlib.contextmanager
def attention_for_runtime() -> Iterator[None]:
    """Export ``scaled_dot_product_attention`` in the form OpenVINO's CPU kernel takes whole.

    A boolean mask becomes an additive one (0 where visible, the dtype's lowest value where
    not): OpenVINO keeps such an attention as its own SDPA kernel (a boolean one was split into
    matmuls and a softmax, 2x slower per step). A query row its mask hides entirely (a
    left-padded prompt's padding) then averages the values instead of eager's zeros, so its
    result is zeroed explicitly: every position computes what eager computes. Grouped-query
    attention (``enable_gqa``) is written as attention over repeated key/value heads (OpenVINO's
    converter ignores the flag). The function is put back afterwards.
    """
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    @functools.wraps(original)
    def attention(
        query: Any, key: Any, value: Any, attn_mask: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        if kwargs.pop("enable_gqa", False) and key.shape[-3] != query.shape[-3]:
            groups = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        # The head count as a constant: exported, it is otherwise a shape expression, and
        # OpenVINO splits an attention of unknown heads into matmuls and a softmax.
        query = query.reshape(query.shape[0], int(query.shape[1]), query.shape[2], query.shape[3])
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.dtype != torch.bool:
            return original(query, key, value, attn_mask, *args, **kwargs)
        visible = attn_mask.any(dim=-1, keepdim=True)
        lowest = torch.finfo(query.dtype).min
        additive = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill(~attn_mask, lowest)
        out = original(query, key, value, additive, *args, **kwargs)
        return torch.where(visible, out, 0.0)

    functional.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def _make_stateful(model: Any, shape: CacheShape) -> None:
    """Name the ports, turn each past/present pair into a state, give states their initial value."""
    import openvino
    from openvino import opset13
    from openvino._offline_transformations import apply_make_stateful_transformation

    pairs = 2 * shape.layers
    if len(model.inputs) != len(INPUTS) + pairs or len(model.outputs) != 1 + pairs:
        raise BackendError(
            f"the converted forward has {len(model.inputs)} inputs and {len(model.outputs)} "
            f"outputs, expected {len(INPUTS) + pairs} and {1 + pairs}"
        )
    for port, name in zip(model.inputs, INPUTS, strict=False):
        port.get_tensor().set_names({name})
    model.outputs[0].get_tensor().set_names({LOGITS})
    for i in range(pairs):
        port = model.inputs[len(INPUTS) + i]
        port.get_tensor().set_names({f"past.{i}"})
        # Known head counts and sizes: OpenVINO keeps an attention whole only on such shapes.
        heads, size = shape.kv_heads[i // 2], shape.head_dims[i // 2]
        port.get_node().set_partial_shape(openvino.PartialShape([-1, heads, -1, size]))
        model.outputs[1 + i].get_tensor().set_names({f"present.{i}"})
    model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(model, {f"past.{i}": f"present.{i}" for i in range(pairs)})
    ids = model.input("input_ids")
    batch = opset13.gather(
        opset13.shape_of(ids, output_type="i64"), opset13.constant([0]), opset13.constant(0)
    )
    reads = [op for op in model.get_ordered_ops() if op.get_type_name() == "ReadValue"]
    if len(reads) != pairs:
        raise BackendError(f"make-stateful made {len(reads)} states, expected {pairs}")
    for op in reads:
        layer = state_index(op.get_variable_id()) // 2
        dims = [
            batch,
            _const(shape.kv_heads[layer]),
            _const(0),
            _const(shape.head_dims[layer]),
        ]
        zero = opset13.constant(0.0, dtype=op.get_output_element_type(0))
        op.set_arguments([opset13.broadcast(zero, opset13.concat(dims, axis=0))])
    model.validate_nodes_and_infer_types()
    # The forms OpenVINO's CPU plugin fuses: attention with the cache update, rotary embedding.
    gathered = gather_state_rows(model)
    if gathered != pairs:  # still served, that attention split into matmuls and a softmax
        log.info("stateful export: %d of %d states feed a concatenation", gathered, pairs)
    fold_scalar_converts(model)


def state_index(variable: str) -> int:
    """The flat cache index (``2 * layer + 0`` for keys, ``+ 1`` for values) a state holds.

    States are named after the input they replaced (``past.<index>``).
    """
    found = _STATE_NAME.match(variable)
    if found is None:
        raise BackendError(f"cannot tell the cache entry of state {variable[:80]!r}")
    return int(found.group(1))


_STATE_NAME = re.compile(r"past\.([0-9]{1,5})(?![0-9])")


def _const(value: int) -> Any:
    from openvino import opset13

    return opset13.constant(np.array([value], dtype=np.int64))
