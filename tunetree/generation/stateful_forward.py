"""Serving a causal LM's forward from a stateful runner, the original forward for the rest.

A call is served when it is what ``generate`` (or a caller like it) makes: ``input_ids``, an
optional ``attention_mask`` and ``position_ids``, a ``DynamicCache`` or a ``StaticCache`` (or
none, with ``use_cache``), and no request the runner cannot answer (hidden states,
attentions, labels, embeddings given instead of ids, more positions than its envelope). The
mask is 2-D, or the 4-D causal mask ``generate`` builds for a static cache (``[batch, 1,
input, capacity]``), served only where it is exactly the causal mask of its padding
(:func:`.static_mask.padding_of`). The cache is either empty (a prefill: the state is reset),
the one the state belongs to (a step: appended), or an ordinary cache of full layers (its
tensors are loaded into the state). Any other call runs the original forward, with its
reason logged once per reason and counted.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError
from .held_cache import held_state_of
from .stateful_runner import StatefulRunner
from .static_mask import cache_lengths, is_served_cache, padding_of

log = logging.getLogger(__name__)

_IGNORED = {"return_dict": None, "cache_position": None}
_MUST_BE_OFF = ("output_attentions", "output_hidden_states", "labels", "inputs_embeds")
_CACHE_NAMES = ("cache", "past_key_values")


@dataclass
class ServeCounts:
    """How many calls the runner served and how many ran the original forward, and why."""

    served: int = 0
    original: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


class StatefulForward:
    """A callable that replaces a causal LM's ``forward`` (see the module's docstring)."""

    def __init__(
        self,
        original: Any,
        runner: StatefulRunner,
        config: Any,
        output_type: type,
        max_length: int,
    ) -> None:
        self.original = original
        self.runner = runner
        self.config = config
        self.output_type = output_type
        self.max_length = max_length
        self.counts = ServeCounts()
        self.record: dict[str, Any] | None = None
        """``{"kind", "config", "accuracy"}`` for a checkpoint (set by whoever built it)."""
        signature = inspect.signature(original)
        self._names = list(signature.parameters)
        # generate reads the forward's signature to decide what to pass (position_ids from the
        # mask, for left-padded rows): it must see the original's.
        self.__signature__ = signature

    def checkpoint_record(self) -> dict[str, Any]:
        """What rebuilds this forward's runner at load (read by :func:`tunetree.save`).

        Raises:
            CheckpointError: the runner was built without a config to record.
        """
        if self.record is None:
            raise CheckpointError(
                "cannot save: this stateful forward was built without a config to record"
            )
        return dict(self.record)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The forward's output for ``kwargs``: the runner's, or the original forward's."""
        if args:
            kwargs = {**dict(zip(self._names, args, strict=False)), **kwargs}
            if len(args) > len(self._names):
                return self._original("positional arguments past the signature", (), kwargs)
        with self.runner.lock:
            served = self._serve(kwargs)
        if isinstance(served, str):
            return self._original(served, (), kwargs)
        self.counts.served += 1
        return served

    def _original(self, reason: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if reason not in self.counts.reasons:
            log.info("stateful generation: the original forward runs a call: %s", reason)
        self.counts.original += 1
        self.counts.reasons[reason] += 1
        return self.original(*args, **kwargs)

    def _serve(self, kwargs: dict[str, Any]) -> Any:
        """The call's output, or the reason it is not served (a string)."""
        from transformers.cache_utils import DynamicCache

        refused = self._refusal(kwargs)
        if refused:
            return refused
        ids = kwargs["input_ids"]
        keep = kwargs.get("logits_to_keep", 0)
        cache = next((kwargs[n] for n in _CACHE_NAMES if kwargs.get(n) is not None), None)
        use_cache = kwargs.get("use_cache")
        if use_cache is None:
            use_cache = bool(getattr(self.config, "use_cache", True))
        past = self._past(cache, ids.shape[0])
        if isinstance(past, str):
            return past
        batch, length = ids.shape
        if past + length > self.max_length:
            return f"{past + length} positions are past the envelope's {self.max_length}"
        inputs = _mask_and_positions(kwargs, batch, length, past)
        if isinstance(inputs, str):
            return inputs
        mask, positions = inputs
        self._prepare(cache, past)
        logits = self.runner.run(ids, mask, positions, keep)
        if cache is None and use_cache:
            cache = DynamicCache(config=self.config)
        if cache is not None:
            state = held_state_of(cache)
            if self.runner.owns(state) and state is not None:
                state.length = self.runner.length
            else:
                self.runner.bind(cache)
        output = self.output_type(
            logits=logits, **{self._cache_field(): cache if use_cache else None}
        )
        if kwargs.get("return_dict") is False:
            return output.to_tuple()
        return output

    def _refusal(self, kwargs: dict[str, Any]) -> str:
        """Why the call's arguments are not served ("" when they are)."""
        known = {"input_ids", "attention_mask", "position_ids", "use_cache", "logits_to_keep"}
        for name, value in kwargs.items():
            if name in known or name in _CACHE_NAMES or name in _IGNORED:
                continue
            if name in _MUST_BE_OFF and not value:
                continue
            return f"{name}={_brief(value)} is not served"
        ids = kwargs.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
            return "input_ids is not a 2-D integer tensor"
        if ids.device.type != "cpu" or ids.shape[0] == 0 or ids.shape[1] == 0:
            return "input_ids is empty or not on the CPU"
        keep = kwargs.get("logits_to_keep", 0)
        if not isinstance(keep, int) or keep < 0:
            return "logits_to_keep is not a non-negative int"
        cache = next((kwargs[n] for n in _CACHE_NAMES if kwargs.get(n) is not None), None)
        if cache is not None and not is_served_cache(cache):
            return f"a {type(cache).__name__} is not served (a DynamicCache or StaticCache is)"
        if cache is not None and len(cache.layers) != self.runner.shape.layers:
            return "the cache has another number of layers"
        return ""

    def _past(self, cache: Any, batch: int) -> int | str:
        """The cache's length, or why it cannot be served."""
        if cache is None:
            return 0
        state = held_state_of(cache)
        if state is not None:
            if not self.runner.owns(state):
                return "the cache is held by another runner"
            if self.runner.batch != batch:
                return f"the cache holds {self.runner.batch} rows, input_ids {batch}"
            return state.length
        lengths = cache_lengths(cache)
        if isinstance(lengths, str):
            return lengths
        if lengths == {0}:
            return 0
        if len(lengths) != 1:
            return "the cache's layers hold different lengths (a window crossed?)"
        first = cache.layers[0].keys
        if first.shape[0] != batch:
            return f"the cache holds {first.shape[0]} rows, input_ids {batch}"
        if first.dtype != self.runner.shape.dtype or first.device.type != "cpu":
            return "the cache's tensors are of another dtype or device"
        return lengths.pop()

    def _prepare(self, cache: Any, past: int) -> None:
        """Reset the state for a prefill, load an ordinary cache, or keep the owned one."""
        if past == 0:
            self.runner.reset()
            return
        if self.runner.owns(held_state_of(cache)):
            return
        tensors = [t[..., :past, :] for layer in cache.layers for t in (layer.keys, layer.values)]
        self.runner.load(tensors)

    def _cache_field(self) -> str:
        fields = getattr(self.output_type, "__dataclass_fields__", {})
        return "cache" if "cache" in fields else "past_key_values"


def _mask_and_positions(
    kwargs: dict[str, Any], batch: int, length: int, past: int
) -> tuple[torch.Tensor, torch.Tensor] | str:
    """The call's mask and positions (eager's defaults when absent), or why they do not fit."""
    mask = kwargs.get("attention_mask")
    if isinstance(mask, dict):  # masks per layer type: served where every layer is full attention
        if set(mask) != {"full_attention"}:
            return f"an attention_mask per layer type ({', '.join(sorted(map(str, mask)))})"
        mask = mask["full_attention"]
    if mask is not None and not isinstance(mask, torch.Tensor):
        return f"an attention_mask of type {type(mask).__name__} is not served"
    if mask is None:
        mask = torch.ones(batch, past + length, dtype=torch.long)
    elif mask.dim() == 4:
        mask = padding_of(mask, batch, length, past)
        if isinstance(mask, str):
            return mask
    elif mask.dim() != 2 or tuple(mask.shape) != (batch, past + length):
        return f"attention_mask of shape {tuple(mask.shape)} is not [batch, cache + input]"
    positions = kwargs.get("position_ids")
    if positions is None:
        return mask, torch.arange(past, past + length).expand(batch, length)
    if positions.dim() != 2 or positions.shape[-1] != length:
        return "position_ids is not [batch or 1, input]"
    return mask, positions.expand(batch, length)


def _brief(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)}"
    return repr(value)[:40]


def is_stateful_forward(module: nn.Module) -> bool:
    """Whether ``module``'s forward is served by a stateful runner."""
    return isinstance(module.__dict__.get("forward"), StatefulForward)
