"""What a stateful runner needs from the caches and masks ``generate`` passes a causal LM.

A static cache (``cache_implementation="static"``) holds a buffer of its capacity per layer
and a count of the positions written; ``generate`` then builds the 4-D causal mask itself
(``[batch, 1, input, capacity]``) instead of passing the 2-D padding mask. The runner takes
the 2-D mask (its graph builds the causal part), so a 4-D mask is served only where it is
exactly the causal mask of some padding: that padding is read back from it and the whole
mask compared with what it implies. Any other 4-D mask (a custom pattern) is refused.
"""

from __future__ import annotations

from typing import Any

import torch

SERVED_CACHES = ("DynamicCache", "StaticCache")
"""The cache classes served (by exact class, from ``transformers.cache_utils``)."""


def is_served_cache(cache: Any) -> bool:
    """Whether ``cache`` is exactly one of :data:`SERVED_CACHES` of transformers."""
    from transformers import cache_utils

    return any(type(cache) is getattr(cache_utils, name, None) for name in SERVED_CACHES)


def is_static_layer(layer: Any) -> bool:
    """Whether ``layer`` is a full-attention static layer (a buffer of ``max_cache_len``)."""
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

    others = tuple(
        c for c in (StaticSlidingWindowLayer, _optional("StaticIndexedLayer")) if c is not None
    )
    return isinstance(layer, StaticLayer) and not isinstance(layer, others)


def _optional(name: str) -> type | None:
    from transformers import cache_utils

    found = getattr(cache_utils, name, None)
    return found if isinstance(found, type) else None


def cache_lengths(cache: Any) -> set[int] | str:
    """The positions each layer of an ordinary (not held) cache holds, or why it is not served."""
    lengths: set[int] = set()
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys is None:
            lengths.add(0)
            continue
        if hasattr(layer, "max_cache_len"):
            if not is_static_layer(layer):
                return f"a {type(layer).__name__} cache layer is not served"
            lengths.add(int(layer.cumulative_length))
            continue
        held = int(layer.keys.shape[-2])
        if getattr(layer, "cumulative_length", None) not in (None, held):
            return "a sliding-window layer has dropped positions"
        lengths.add(held)
    return lengths


def padding_of(mask: torch.Tensor, batch: int, length: int, past: int) -> torch.Tensor | str:
    """The 2-D padding mask (``[batch, past + length]``, 1 = attend) a 4-D causal mask implies.

    Returns why it is not served instead (a string) when the mask has another shape or kind,
    or is not exactly the causal mask of that padding (keys past the input never attended).
    """
    total = past + length
    if mask.shape[0] != batch or mask.shape[1] != 1 or mask.shape[2] != length:
        return f"attention_mask of shape {tuple(mask.shape)} is not [batch, 1, input, capacity]"
    if mask.shape[3] < total:
        return f"the 4-D attention_mask covers {mask.shape[3]} keys, fewer than {total}"
    if mask.dtype == torch.bool:
        allowed = mask[:, 0]
    elif mask.is_floating_point():
        allowed = mask[:, 0] == 0
        blocked = mask[:, 0][~allowed]
        if blocked.numel() and bool((blocked > torch.finfo(mask.dtype).min / 2).any()):
            return "the 4-D attention_mask adds values other than 0 and a large negative one"
    else:
        return f"a 4-D attention_mask of {mask.dtype} is not served"
    padding = allowed[:, -1, :total]
    causal = torch.ones(length, total, dtype=torch.bool).tril(diagonal=past)
    expected = padding[:, None, :] & causal
    if not torch.equal(allowed[:, :, :total], expected) or bool(allowed[:, :, total:].any()):
        return "the 4-D attention_mask is not the causal mask of its padding"
    return padding.to(torch.long)
