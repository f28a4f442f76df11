"""Build a causal LM served whole by a stateful OpenVINO model: the public entry and its config.

``stateful_model(model)`` returns a shallow copy of ``model`` (sharing its parameters; the
model given stays as it was) whose ``forward`` is a :class:`.StatefulForward`:
``generate`` called the usual way (default dynamic cache) runs its own loop, logits
processors and stopping criteria, and every step's forward is one infer request with the KV
cache kept inside it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any, ClassVar

import torch
from torch import nn

from ..backends.openvino import load_openvino
from ..errors import BackendError, InvalidInputError
from .stateful_export import CacheShape, export_stateful, output_cache
from .stateful_forward import StatefulForward
from .stateful_runner import StatefulRunner
from .weights import compress_int4, compress_int8

log = logging.getLogger(__name__)

PRECISIONS = ("f32", "bf16")
WEIGHTS = (None, "int8", "int8-channel", "int4")


@dataclasses.dataclass(frozen=True)
class StatefulConfig:
    """How the stateful model computes.

    ``precision`` is OpenVINO's ``INFERENCE_PRECISION_HINT`` (``"f32"`` keeps results;
    ``"bf16"`` changes them and needs a CPU with bf16 units). ``weights="int8"`` compresses
    the matmul weights to 8 bits per group of inputs, ``"int8-channel"`` to 8 bits per output
    channel with f16 scales (fewer bytes, a larger error), ``"int4"`` to 4 bits per group of inputs
    (weight-only; all change results: :mod:`tunetree.generation.weights`). ``max_length``
    bounds the positions served (None: the model's ``max_position_embeddings``, and below a
    sliding window).
    """

    precision: str = "f32"
    weights: str | None = None
    max_length: int | None = None
    name: ClassVar[str] = "openvino-stateful"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise InvalidInputError(
                f"precision must be one of {PRECISIONS}, not {self.precision!r}"
            )
        if self.weights not in WEIGHTS:
            raise InvalidInputError(f"weights must be one of {WEIGHTS}, not {self.weights!r}")
        if self.max_length is not None and self.max_length < 1:
            raise InvalidInputError(f"max_length must be >= 1, not {self.max_length}")

    @property
    def preserves_results(self) -> bool:
        """Whether outputs stay eager's (f32 compute, weights as they are)."""
        return self.precision == "f32" and self.weights is None

    @property
    def label(self) -> str:
        """A short name for tables: ``openvino-stateful f32``, ``... bf16 int8-weights``."""
        parts = [self.name, self.precision]
        if self.weights:
            parts.append(f"{self.weights}-weights")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The config as a checkpoint records it (its kind is :attr:`name`)."""
        return {"precision": self.precision, "weights": self.weights, "max_length": self.max_length}

    def compile_config(self) -> dict[str, Any]:
        """The properties passed to OpenVINO's ``compile_model``.

        The KV cache of the results-keeping config is held in f32: the CPU plugin's fused
        attention otherwise keeps it as 8-bit integers (its default), which changes results.
        A config that changes results anyway (judged by its budget, cache included) holds it
        in 16 bits: bf16 with bf16 compute, f16 beside compressed f32-compute weights (what
        optimum-intel's exports ask for), which reads half the bytes per step.
        """
        cache = self.precision if self.preserves_results or self.precision == "bf16" else "f16"
        return {
            "INFERENCE_PRECISION_HINT": self.precision,
            "PERFORMANCE_HINT": "LATENCY",
            "KV_CACHE_PRECISION": cache,
        }


def unavailable_reason(model: Any) -> str | None:
    """Why ``model`` cannot get a stateful runner, or None."""
    try:
        load_openvino()
    except ImportError:
        return "OpenVINO is not installed (pip install 'tunetree[openvino]')"
    if not isinstance(model, nn.Module) or not hasattr(model, "generate"):
        return "not a Hugging Face model with generate"
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return "not a decoder-only causal LM"
    params = list(model.parameters())
    if not params or any(p.device.type != "cpu" for p in params):
        return "the model's parameters are not all on the CPU"
    if any(p.dtype != torch.float32 for p in params if p.is_floating_point()):
        return "the model's parameters are not all float32"
    return None


def bf16_reason() -> str | None:
    """Why OpenVINO would not compute in bf16 on this CPU (no bf16 units), or None."""
    from ..backends.openvino import _core

    capabilities = list(_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    if "BF16" not in capabilities:
        return "this CPU has no bf16 units (OpenVINO would compute in f32)"
    return None


def probe(model: nn.Module) -> tuple[CacheShape, type]:
    """The KV cache layout and the output type, from one tiny eager call.

    Raises:
        BackendError: the model returns no Hugging Face dynamic cache of key/value layers.
    """
    from transformers.cache_utils import DynamicCache

    ids = torch.zeros(1, 2, dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
    cache = output_cache(out)
    if type(cache) is not DynamicCache:
        raise BackendError(
            f"the model returned {type(cache).__name__} for its cache, not a DynamicCache: "
            "no stateful export"
        )
    found = [getattr(layer, "keys", None) for layer in cache.layers]
    keys: list[torch.Tensor] = [k for k in found if isinstance(k, torch.Tensor)]
    if len(keys) != len(found) or not all(k.dim() == 4 and k.shape[-2] == 2 for k in keys):
        raise BackendError("a cache layer does not hold [batch, heads, positions, size] keys")
    shape = CacheShape(
        layers=len(keys),
        kv_heads=tuple(int(k.shape[1]) for k in keys),
        head_dims=tuple(int(k.shape[3]) for k in keys),
        sliding=tuple(bool(getattr(layer, "is_sliding", False)) for layer in cache.layers),
        dtype=keys[0].dtype,
    )
    return shape, type(out)


def envelope(model: nn.Module, shape: CacheShape, config: StatefulConfig) -> int:
    """The most positions (cache + input) a call may reach and be served."""
    hf = getattr(model, "config", None)
    limit = int(getattr(hf, "max_position_embeddings", 0) or 0) or 2048
    if any(shape.sliding):
        window = getattr(hf, "sliding_window", None)
        if isinstance(window, int) and window > 1:
            limit = min(limit, window - 1)
    if config.max_length is not None:
        limit = min(limit, config.max_length)
    return limit


@dataclasses.dataclass(frozen=True)
class Exported:
    """The whole forward converted once; every config compiles its own runner from it."""

    model: Any
    shape: CacheShape
    output_type: type


def export_whole(model: nn.Module) -> Exported:
    """Export and convert ``model``'s whole forward to a stateful OpenVINO model.

    Raises:
        BackendError: the model is not served this way (the reason is in the message).
    """
    reason = unavailable_reason(model)
    if reason is not None:
        raise BackendError(reason)
    shape, output_type = probe(model)
    return Exported(export_stateful(model, shape), shape, output_type)


def compressed(model: Any, weights: str | None) -> Any:
    """``model`` with its matmul weights compressed as ``weights`` says (a copy), or itself.

    8 bits per output channel keeps its scales in f16, as NNCF writes them: half their bytes,
    the same error (the scales are rounded to 11 bits, the weights to 8), still fused into
    compressed matmuls by the CPU plugin. Groups keep f32 scales: their error is the one the
    budget needs when per channel is over it, and f16 scales would add to it.
    """
    if weights == "int8":
        return compress_int8(model)
    if weights == "int8-channel":
        return compress_int8(model, group=None, half_scales=True)
    if weights == "int4":
        return compress_int4(model)
    return model


def runner_for(exported: Exported, config: StatefulConfig) -> StatefulRunner:
    """The runner of ``config``: weights compressed if asked (on a copy), then compiled."""
    converted = compressed(exported.model, config.weights)
    return StatefulRunner(converted, exported.shape, config.compile_config())


def attach(
    model: nn.Module,
    runner: StatefulRunner,
    output_type: type,
    max_length: int,
    config: StatefulConfig | None = None,
) -> nn.Module:
    """A shallow copy of ``model`` whose forward the runner serves.

    With ``config``, the forward carries the record a checkpoint saves to rebuild it (results
    kept; a config that changes them is recorded once its accuracy is measured).
    """
    twin = copy.copy(model)  # shares parameters, buffers, submodules and hooks
    twin.__dict__.pop("forward", None)
    original = twin.forward
    forward = StatefulForward(original, runner, model.config, output_type, max_length)
    if config is not None:
        forward.record = {"kind": config.name, "config": config.to_json(), "accuracy": None}
    twin.__dict__["forward"] = forward
    return twin


def stateful_model(model: nn.Module, config: StatefulConfig | None = None) -> nn.Module:
    """``model`` with its whole forward served by a stateful OpenVINO model (not checked here).

    Raises:
        BackendError: the model cannot be served this way (the reason is in the message).
    """
    config = config or StatefulConfig()
    exported = export_whole(model)
    runner = runner_for(exported, config)
    limit = envelope(model, exported.shape, config)
    return attach(model, runner, exported.output_type, limit, config)
