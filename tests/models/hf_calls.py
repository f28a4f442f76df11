"""Building and calling the conformance zoo's families (see ``hf_zoo.py``).

A :class:`Family` builds a tiny model from its ``transformers`` config class with random
weights and calls it as its users do; this module holds the class, the shared settings and the
calls (padded text, pixels, audio, generation settings), so that the families of each round
(``hf_zoo.py``, ``hf_zoo_second.py``) are only their lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import transformers
from torch import nn

Call = dict[str, Any]
CallFn = Callable[[int, int, int], Call]

KINDS = ("decoder", "causal-lm", "encoder", "seq2seq", "vision", "audio", "multimodal")

VOCAB = 512
SPECIAL = 4
"""Ids below this and from ``VOCAB - SPECIAL`` up are kept for special tokens: random text
never contains them, so padding and eos positions are only where a call puts them."""
TEXT = (8, 32)
"""Sequence lengths of text families; positions in every config reach past the unseen call."""
POSITIONS = 128
SIDES = (32, 64)
"""Image sides of vision families that take any size."""
IMAGE = 32
"""The image side of families whose users resize to the config's ``image_size``."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One architecture: how to build a tiny model of it and how its users call it.

    ``build()`` seeds torch itself and returns the model in eval mode; ``call(batch, length,
    seed)`` returns the keyword arguments of one ``model(**kwargs)`` call, the same for the
    same arguments. ``lengths`` is the (min, max) of the length axis used for tuning calls.
    """

    name: str
    kind: str
    build: Callable[[], nn.Module]
    call: CallFn
    lengths: tuple[int, int] = TEXT
    fast: bool = False
    generate: dict[str, Any] | None = None
    """For a generate family: the keyword arguments of ``model.generate(**call, **generate)``,
    which it is tuned and checked through (tokens must equal eager's)."""
    batches: tuple[int, int, int] = (1, 2, 3)
    """The tuning calls' batch sizes. Decoder-only generate families tune at (2, 3, 2):
    ``generate`` drops a batch of one's all-ones mask, which makes its steps graphs of their
    own, so the unseen calls at batch 2 would otherwise lie outside every range."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")
        low, high = self.lengths
        if not (low == high or high - low >= 4):
            raise ValueError(f"{self.name}: lengths {self.lengths} leave no room inside")


# Building ---------------------------------------------------------------------------------


def _builder(model: str, /, **settings: Any) -> Callable[[], nn.Module]:
    """A ``build`` for ``transformers.<model>`` with its config class made from ``settings``."""

    def build() -> nn.Module:
        cls = getattr(transformers, model)
        config = cls.config_class(**settings)
        torch.manual_seed(0)
        return cls(config).eval()

    return build


def _heads(hidden: int, heads: int, **settings: Any) -> dict[str, Any]:
    """Settings of a two-layer transformer with the usual (Llama/BERT) config names."""
    return {
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "max_position_embeddings": POSITIONS,
        **settings,
    }


LLAMA_LIKE = _heads(32, 4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
BERT_LIKE = _heads(32, 2, pad_token_id=0)
ROBERTA_LIKE = {**BERT_LIKE, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
ENCODER_DECODER = {
    "vocab_size": VOCAB,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
}
"""Settings of BART-style encoder-decoders (BART, Marian, Whisper), less their positions."""
BART_LIKE = {**ENCODER_DECODER, "max_position_embeddings": POSITIONS, "decoder_start_token_id": 2}
GPT2_LIKE = {
    "vocab_size": VOCAB,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": POSITIONS,
    "bos_token_id": VOCAB - 1,
    "eos_token_id": VOCAB - 1,
}
VIT_LIKE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": IMAGE,
    "patch_size": 8,
}
AUDIO_LIKE = {
    **VIT_LIKE,
    "conv_dim": (16, 16),
    "conv_stride": (5, 2),
    "conv_kernel": (10, 3),
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
}


BASE = {"use_cache": False}
"""Base decoders are called for their hidden states, without a cache."""
SMALL_HEAD = {**LLAMA_LIKE, "head_dim": 8}
"""Gemma and Qwen3 give the head size on its own (Gemma's default is 256)."""
ROBERTA_POSITIONS = {"max_position_embeddings": POSITIONS + 2}
"""RoBERTa's positions start after the padding index."""
FIXED = (IMAGE, IMAGE)


# Calling ----------------------------------------------------------------------------------


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _real_lengths(gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """How many real tokens each row has, as when a batch is padded to its longest row.

    Row 0 is the longest; the others, when there are others and room, are shorter but keep
    at least half of ``length`` (so at least one real token).
    """
    real = torch.full((batch,), length, dtype=torch.long)
    if batch > 1 and length > 1:
        real[1:] = torch.randint((length + 1) // 2, length, (batch - 1,), generator=gen)
    return real


def _mask(real: torch.Tensor, length: int, left: bool = False) -> torch.Tensor:
    """The attention mask of rows with ``real`` tokens, padded at the end (or the start)."""
    positions = torch.arange(length).expand(len(real), length)
    if left:
        return (positions >= (length - real)[:, None]).long()
    return (positions < real[:, None]).long()


def _ids(gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """Random ordinary token ids (never a special one)."""
    return torch.randint(SPECIAL, VOCAB - SPECIAL, (batch, length), generator=gen)


def _segments(mask: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``token_type_ids`` of a sentence pair: the second half of the real tokens is 1."""
    return ((mask.cumsum(1) > (real // 2)[:, None]) & mask.bool()).long()


def _text(
    pad: int = 0,
    *,
    left: bool = False,
    segments: bool = False,
    eos: int | None = None,
    mask: bool = True,
    **fixed: Any,
) -> CallFn:
    """A ``call`` for padded text: ``input_ids`` and (unless not ``mask``) ``attention_mask``.

    Args:
        pad: The id on padded positions, as the tokenizer writes it.
        left: Pad at the start (generation) instead of the end.
        segments: Also pass ``token_type_ids`` (a sentence pair).
        eos: An id written on each row's last real token.
        mask: Pass the attention mask (SigLIP users pad to max length and pass none).
        **fixed: Further keyword arguments passed unchanged (``use_cache=False``, ...).
    """

    def call(batch: int, length: int, seed: int) -> Call:
        gen = _generator(seed)
        real = _real_lengths(gen, batch, length)
        attention = _mask(real, length, left)
        ids = _ids(gen, batch, length).masked_fill(attention == 0, pad)
        if eos is not None:
            last = length - 1 if left else real - 1
            ids[torch.arange(batch), last] = eos
        kwargs: Call = {"input_ids": ids}
        if mask:
            kwargs["attention_mask"] = attention
        if segments:
            kwargs["token_type_ids"] = _segments(attention, real)
        return {**kwargs, **fixed}

    return call


def _decoder_ids(gen: torch.Generator, batch: int, length: int, start: int) -> torch.Tensor:
    """``decoder_input_ids`` as shifted labels are: the decoder start token, then text."""
    ids = _ids(gen, batch, length)
    ids[:, 0] = start
    return ids


def _seq2seq(pad: int, start: int) -> CallFn:
    """A ``call`` for encoder-decoders: padded source text and a target half as long."""
    source = _text(pad)

    def call(batch: int, length: int, seed: int) -> Call:
        kwargs = source(batch, length, seed)
        target = _decoder_ids(_generator(seed + 1), batch, max(1, length // 2), start)
        return {**kwargs, "decoder_input_ids": target}

    return call


def _pixels(gen: torch.Generator, batch: int, side: int) -> torch.Tensor:
    return torch.randn(batch, 3, side, side, generator=gen)


def _vision(batch: int, length: int, seed: int) -> Call:
    return {"pixel_values": _pixels(_generator(seed), batch, length)}


def _two_towers(text: CallFn) -> CallFn:
    """A ``call`` for text-image models: ``text``'s arguments and one image per text."""

    def call(batch: int, length: int, seed: int) -> Call:
        gen = _generator(seed + 1)
        return {**text(batch, length, seed), "pixel_values": _pixels(gen, batch, IMAGE)}

    return call


def _audio(mask: bool) -> CallFn:
    """A ``call`` for raw audio: ``input_values``, zero-padded with their mask if ``mask``.

    Without a mask the rows are all of full length, as users of such models batch them.
    """

    def call(batch: int, length: int, seed: int) -> Call:
        gen = _generator(seed)
        if not mask:
            return {"input_values": torch.randn(batch, length, generator=gen)}
        attention = _mask(_real_lengths(gen, batch, length), length)
        values = torch.randn(batch, length, generator=gen) * attention
        return {"input_values": values, "attention_mask": attention}

    return call


WHISPER_MELS = 16
WHISPER_POSITIONS = 32
"""Whisper's encoder takes exactly ``2 * max_source_positions`` mel frames."""
WHISPER_START = 1


def _whisper(batch: int, length: int, seed: int) -> Call:
    """Log-mel ``input_features`` (``length`` frames) and a few decoder prompt tokens."""
    gen = _generator(seed)
    features = torch.randn(batch, WHISPER_MELS, length, generator=gen)
    prompt = _decoder_ids(gen, batch, max(1, length // 8), WHISPER_START)
    return {"input_features": features, "decoder_input_ids": prompt}


# Families ---------------------------------------------------------------------------------


def _family(
    name: str,
    kind: str,
    model: str,
    settings: dict[str, Any],
    call: CallFn,
    lengths: tuple[int, int] = TEXT,
    fast: bool = False,
    generate: dict[str, Any] | None = None,
    batches: tuple[int, int, int] = (1, 2, 3),
) -> Family:
    return Family(name, kind, _builder(model, **settings), call, lengths, fast, generate, batches)


NEW_TOKENS = 8
"""Tokens each generate family makes: greedy, so the tokens are eager's exactly."""


def _greedy(**settings: Any) -> dict[str, Any]:
    """Greedy generation of exactly :data:`NEW_TOKENS` (random weights may emit eos at once)."""
    return {
        "max_new_tokens": NEW_TOKENS,
        "min_new_tokens": NEW_TOKENS,
        "do_sample": False,
        **settings,
    }


# Calls ------------------------------------------------------------------------------------


def _mid(low: int, high: int) -> int:
    return (low + high) // 2


def tuning_calls(family: Family) -> list[Call]:
    """Three calls to tune on: batch 1, 2, 3 (``family.batches``) at min, mid and max length."""
    low, high = family.lengths
    lengths = (low, _mid(low, high), high)
    return [
        family.call(batch, length, i)
        for i, (batch, length) in enumerate(zip(family.batches, lengths, strict=True))
    ]


def unseen_inside(family: Family) -> list[Call]:
    """Two calls inside the tuning ranges, at lengths no tuning call has.

    Batch 2 is the only batch strictly inside 1..3. A family of fixed length has no such
    length: its two calls are at batch 2 and its one length, with new values.
    """
    low, high = family.lengths
    mid = _mid(low, high)
    return [family.call(2, _mid(low, mid), 10), family.call(2, _mid(mid, high), 11)]


def unseen_outside(family: Family) -> list[Call]:
    """One call past the tuning ranges: batch 4 and a longer length (unless it is fixed)."""
    low, high = family.lengths
    return [family.call(4, high + (high - low) // 2, 20)]
