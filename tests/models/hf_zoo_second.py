"""The conformance zoo's second round (issue 31): families a new user tried that ended untuned.

State-space (Mamba), mixtures of experts (Mixtral, Qwen2-MoE), generate through decoder-only
and encoder-decoder models (Gemma2, T5, BART, Marian, Whisper), long-context encoders
(Longformer, ModernBERT) and vision models with size arguments or deep convolution stacks
(BEiT, DPT, EfficientNet). Each is built and called as in ``hf_zoo.py``.
"""

from __future__ import annotations

import torch

from .hf_calls import (
    BART_LIKE,
    BASE,
    BERT_LIKE,
    ENCODER_DECODER,
    FIXED,
    IMAGE,
    LLAMA_LIKE,
    ROBERTA_LIKE,
    ROBERTA_POSITIONS,
    SIDES,
    SMALL_HEAD,
    VIT_LIKE,
    VOCAB,
    WHISPER_MELS,
    WHISPER_POSITIONS,
    WHISPER_START,
    Call,
    _family,
    _generator,
    _greedy,
    _text,
    _vision,
)

# The second round (issue 31): state-space, mixture-of-experts, generate, more vision and
# long-context encoders.

MAMBA = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "state_size": 8,
    "num_hidden_layers": 2,
    "conv_kernel": 4,
    "expand": 2,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
MIXTRAL = {**LLAMA_LIKE, "num_local_experts": 4, "num_experts_per_tok": 2}
QWEN2_MOE = {
    **LLAMA_LIKE,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "decoder_sparse_step": 1,
}
GEMMA2 = {**SMALL_HEAD, "query_pre_attn_scalar": 8, "sliding_window": 16}
T5 = {
    "vocab_size": VOCAB,
    "d_model": 32,
    "d_kv": 8,
    "d_ff": 64,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 8,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}
MARIAN = {
    **BART_LIKE,
    "pad_token_id": VOCAB - 1,
    "decoder_start_token_id": VOCAB - 1,
    "eos_token_id": 0,
}
WHISPER = {
    **ENCODER_DECODER,
    "num_mel_bins": WHISPER_MELS,
    "max_source_positions": WHISPER_POSITIONS,
    "max_target_positions": WHISPER_POSITIONS,
    "decoder_start_token_id": WHISPER_START,
    "begin_suppress_tokens": None,
}


def _whisper_features(batch: int, length: int, seed: int) -> Call:
    """Log-mel ``input_features`` only: generate starts the decoder itself."""
    return {"input_features": torch.randn(batch, WHISPER_MELS, length, generator=_generator(seed))}


MASKED_BATCHES = (2, 3, 2)
"""Decoder-only generate families tune at batch 2 and 3 (see ``Family.batches``)."""

STATE_SPACE = [
    _family(
        "mamba",
        "decoder",
        "MambaModel",
        MAMBA,
        _text(0, mask=False, use_cache=False),
    ),
    _family(
        "mamba-generate",
        "causal-lm",
        "MambaForCausalLM",
        MAMBA,
        _text(0, left=True),
        generate=_greedy(pad_token_id=0),
        batches=MASKED_BATCHES,
    ),
]

MIXTURES = [
    _family("mixtral", "decoder", "MixtralModel", MIXTRAL, _text(0, **BASE)),
    _family("qwen2-moe", "decoder", "Qwen2MoeModel", QWEN2_MOE, _text(0, **BASE)),
    _family(
        "mixtral-generate",
        "causal-lm",
        "MixtralForCausalLM",
        MIXTRAL,
        _text(0, left=True),
        generate=_greedy(pad_token_id=0),
        batches=MASKED_BATCHES,
    ),
    _family(
        "qwen2-moe-generate",
        "causal-lm",
        "Qwen2MoeForCausalLM",
        QWEN2_MOE,
        _text(0, left=True),
        generate=_greedy(pad_token_id=0),
        batches=MASKED_BATCHES,
    ),
]

GENERATE = [
    _family(
        "gemma2-generate",
        "causal-lm",
        "Gemma2ForCausalLM",
        GEMMA2,
        _text(0, left=True),
        generate=_greedy(pad_token_id=0),
        batches=MASKED_BATCHES,
    ),
    _family(
        "t5-generate",
        "seq2seq",
        "T5ForConditionalGeneration",
        T5,
        _text(0),
        generate=_greedy(),
    ),
    _family(
        "bart-generate",
        "seq2seq",
        "BartForConditionalGeneration",
        BART_LIKE,
        _text(1),
        generate=_greedy(num_beams=1, forced_bos_token_id=None, forced_eos_token_id=None),
    ),
    _family(
        "marian-generate", "seq2seq", "MarianMTModel", MARIAN, _text(VOCAB - 1), generate=_greedy()
    ),
    _family(
        "whisper-generate",
        "seq2seq",
        "WhisperForConditionalGeneration",
        WHISPER,
        _whisper_features,
        lengths=(2 * WHISPER_POSITIONS, 2 * WHISPER_POSITIONS),
        generate=_greedy(),
    ),
]

MORE_ENCODERS = [
    _family(
        "longformer",
        "encoder",
        "LongformerModel",
        {**ROBERTA_LIKE, **ROBERTA_POSITIONS, "attention_window": [8, 8]},
        _text(1),
    ),
    _family(
        "modernbert",
        "encoder",
        "ModernBertModel",
        {
            **BERT_LIKE,
            "global_attn_every_n_layers": 2,
            "local_attention": 16,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "cls_token_id": 1,
            "sep_token_id": 2,
        },
        _text(0),
    ),
]

MORE_VISION = [
    _family("beit", "vision", "BeitModel", VIT_LIKE, _vision, FIXED),
    _family(
        "dpt",
        "vision",
        "DPTForDepthEstimation",
        {
            **VIT_LIKE,
            "num_hidden_layers": 4,
            "backbone_out_indices": [0, 1, 2, 3],
            "neck_hidden_sizes": [16, 16, 32, 32],
            "fusion_hidden_size": 16,
            "reassemble_factors": [4, 2, 1, 0.5],
        },
        _vision,
        FIXED,
    ),
    _family(
        "efficientnet",
        "vision",
        "EfficientNetModel",
        {
            "image_size": IMAGE,
            "width_coefficient": 0.25,
            "depth_coefficient": 0.25,
            "hidden_dim": 320,  # the top convolution's 1280 channels at width 0.25
        },
        _vision,
        SIDES,
    ),
]

SECOND_ROUND = [*STATE_SPACE, *MIXTURES, *GENERATE, *MORE_ENCODERS, *MORE_VISION]
"""The families issue 31 added: tried by a new user, 12 of 28 such families ended untuned."""
