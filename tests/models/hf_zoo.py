"""The conformance zoo of issue 20: Hugging Face families built from configs with random weights.

Each :class:`Family` builds a tiny model of one architecture (two layers or the smallest valid
structure, hidden sizes of 16-64, small vocabularies) from its ``transformers`` config class,
so nothing is downloaded, and calls it the way its real users do: padded text with an
attention mask (right padding for base models, left padding for causal-LM heads, as
generation does), ``token_type_ids`` where the tokenizer returns them, ``decoder_input_ids``
for encoder-decoders, pixels, audio samples or mel features. Model classes are looked up by
name when a family is built, so importing this module imports no modeling code.

The ``length`` axis of a call is the sequence length for text, the image side for vision and
the number of audio samples (Whisper: mel frames) for audio; multimodal families vary their
text. Families whose shapes are fixed by their users (ViT, DeiT, SigLIP, Whisper) have
``lengths == (n, n)`` and vary their batch only.
"""

from __future__ import annotations

from .hf_calls import (
    AUDIO_LIKE,
    BART_LIKE,
    BASE,
    BERT_LIKE,
    ENCODER_DECODER,
    FIXED,
    GPT2_LIKE,
    IMAGE,
    KINDS,
    LLAMA_LIKE,
    POSITIONS,
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
    Family,
    _audio,
    _family,
    _heads,
    _seq2seq,
    _text,
    _two_towers,
    _vision,
    _whisper,
    tuning_calls,
    unseen_inside,
    unseen_outside,
)
from .hf_zoo_second import SECOND_ROUND

__all__ = ["FAMILIES", "KINDS", "Call", "Family", "tuning_calls", "unseen_inside", "unseen_outside"]


DECODERS = [
    _family("llama", "decoder", "LlamaModel", LLAMA_LIKE, _text(0, **BASE), fast=True),
    _family("mistral", "decoder", "MistralModel", LLAMA_LIKE, _text(0, **BASE)),
    _family("qwen2", "decoder", "Qwen2Model", LLAMA_LIKE, _text(0, **BASE)),
    _family("qwen3", "decoder", "Qwen3Model", SMALL_HEAD, _text(0, **BASE)),
    _family("gemma", "decoder", "GemmaModel", SMALL_HEAD, _text(0, **BASE)),
    _family(
        "gemma2",
        "decoder",
        "Gemma2Model",
        {**SMALL_HEAD, "query_pre_attn_scalar": 8, "sliding_window": 16},
        _text(0, **BASE),
    ),
    _family("phi3", "decoder", "Phi3Model", LLAMA_LIKE, _text(0, **BASE)),
    _family(
        "gpt-neox",
        "decoder",
        "GPTNeoXModel",
        _heads(32, 4, bos_token_id=0, eos_token_id=2, pad_token_id=1),
        _text(1, **BASE),
    ),
    _family(
        "opt",
        "decoder",
        "OPTModel",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "word_embed_proj_dim": 32,
            "ffn_dim": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": POSITIONS,
            "pad_token_id": 1,
            "bos_token_id": 2,
            "eos_token_id": 2,
        },
        _text(1, **BASE),
    ),
    _family(
        "falcon",
        "decoder",
        "FalconModel",
        _heads(32, 4, bos_token_id=1, eos_token_id=2, pad_token_id=2),
        _text(2, **BASE),
    ),
    _family(
        "bloom",
        "decoder",
        "BloomModel",
        {"vocab_size": VOCAB, "hidden_size": 32, "n_layer": 2, "n_head": 4, "pad_token_id": 3},
        _text(3, **BASE),
    ),
    # GPT-2 users pad with the eos token.
    _family("gpt2", "decoder", "GPT2Model", GPT2_LIKE, _text(VOCAB - 1, **BASE), fast=True),
]

CAUSAL_LMS = [
    _family(
        "llama-lm", "causal-lm", "LlamaForCausalLM", LLAMA_LIKE, _text(0, left=True), fast=True
    ),
    _family("qwen2-lm", "causal-lm", "Qwen2ForCausalLM", LLAMA_LIKE, _text(0, left=True)),
    _family("gpt2-lm", "causal-lm", "GPT2LMHeadModel", GPT2_LIKE, _text(VOCAB - 1, left=True)),
]

RELATIVE = {
    "relative_attention": True,
    "pos_att_type": ["p2c", "c2p"],
    "position_buckets": 32,
    "max_relative_positions": -1,
    "position_biased_input": False,
}
"""DeBERTa-v3's disentangled attention (DeBERTa-v3 is the DeBERTa-v2 architecture)."""

ENCODERS = [
    _family("bert", "encoder", "BertModel", BERT_LIKE, _text(0, segments=True), fast=True),
    _family(
        "roberta",
        "encoder",
        "RobertaModel",
        {**ROBERTA_LIKE, **ROBERTA_POSITIONS},
        _text(1, return_dict=True),
    ),
    _family(
        "deberta-v2",
        "encoder",
        "DebertaV2Model",
        {**BERT_LIKE, **RELATIVE},
        _text(0, segments=True, output_hidden_states=True),
    ),
    _family(
        "albert",
        "encoder",
        "AlbertModel",
        {**BERT_LIKE, "embedding_size": 16, "bos_token_id": 2, "eos_token_id": 3},
        _text(0, segments=True),
    ),
    _family(
        "electra",
        "encoder",
        "ElectraModel",
        {**BERT_LIKE, "embedding_size": 16},
        _text(0, segments=True, output_hidden_states=True),
    ),
    _family(
        "distilbert",
        "encoder",
        "DistilBertModel",
        {
            "vocab_size": VOCAB,
            "dim": 32,
            "n_layers": 2,
            "n_heads": 2,
            "hidden_dim": 64,
            "max_position_embeddings": POSITIONS,
            "pad_token_id": 0,
        },
        _text(0),
    ),
    _family(
        "xlm-roberta",
        "encoder",
        "XLMRobertaModel",
        {**ROBERTA_LIKE, **ROBERTA_POSITIONS},
        _text(1, return_dict=True),
    ),
]

SEQ2SEQ = [
    _family(
        "t5",
        "seq2seq",
        "T5Model",
        {
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
        },
        _seq2seq(0, 0),
        fast=True,
    ),
    _family("bart", "seq2seq", "BartModel", BART_LIKE, _seq2seq(1, 2), fast=True),
    # Marian pads with the last id and starts decoding with it; its eos is 0.
    _family(
        "marian",
        "seq2seq",
        "MarianModel",
        {
            **BART_LIKE,
            "pad_token_id": VOCAB - 1,
            "decoder_start_token_id": VOCAB - 1,
            "eos_token_id": 0,
        },
        _seq2seq(VOCAB - 1, VOCAB - 1),
    ),
    _family(
        "whisper",
        "seq2seq",
        "WhisperModel",
        {
            **ENCODER_DECODER,
            "num_mel_bins": WHISPER_MELS,
            "max_source_positions": WHISPER_POSITIONS,
            "max_target_positions": WHISPER_POSITIONS,
            "decoder_start_token_id": WHISPER_START,
            "begin_suppress_tokens": None,
        },
        _whisper,
        lengths=(2 * WHISPER_POSITIONS, 2 * WHISPER_POSITIONS),
    ),
]

STAGES = {"hidden_sizes": [16, 32], "depths": [1, 1]}
"""Two stages of one block each, for the hierarchical vision models."""

VISION = [
    # ViT and DeiT users resize images to the config's size (no interpolate_pos_encoding).
    _family("vit", "vision", "ViTModel", VIT_LIKE, _vision, FIXED, fast=True),
    _family("deit", "vision", "DeiTModel", VIT_LIKE, _vision, FIXED),
    _family("convnext", "vision", "ConvNextModel", {**STAGES, "num_stages": 2}, _vision, SIDES),
    _family(
        "swin",
        "vision",
        "SwinModel",
        {
            "image_size": IMAGE,
            "patch_size": 4,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [2, 2],
            "window_size": 4,
        },
        _vision,
        SIDES,
    ),
    _family(
        "resnet",
        "vision",
        "ResNetModel",
        {**STAGES, "embedding_size": 16, "layer_type": "basic"},
        _vision,
        SIDES,
        fast=True,
    ),
    _family(
        "mobilenet-v2",
        "vision",
        "MobileNetV2Model",
        {"depth_multiplier": 0.35, "finegrained_output": False, "image_size": IMAGE},
        _vision,
        SIDES,
    ),
    # DINOv2 interpolates its position embeddings to any image size on every call.
    _family("dinov2", "vision", "Dinov2Model", VIT_LIKE, _vision, SIDES),
    _family(
        "segformer",
        "vision",
        "SegformerModel",
        {
            **STAGES,
            "num_encoder_blocks": 2,
            "sr_ratios": [2, 1],
            "patch_sizes": [7, 3],
            "strides": [4, 2],
            "num_attention_heads": [1, 2],
            "mlp_ratios": [2, 2],
        },
        _vision,
        SIDES,
    ),
]

SAMPLES = (400, 1600)
"""Audio samples: 40 to 160 frames after the feature extractor's strides of 5 and 2."""

AUDIO = [
    # Wav2Vec2 with layer norm in its feature extractor (the large models) takes a mask.
    _family(
        "wav2vec2",
        "audio",
        "Wav2Vec2Model",
        {**AUDIO_LIKE, "feat_extract_norm": "layer", "do_stable_layer_norm": True},
        _audio(mask=True),
        SAMPLES,
        fast=True,
    ),
    # HuBERT base (group norm) users pass no attention mask.
    _family(
        "hubert",
        "audio",
        "HubertModel",
        {**AUDIO_LIKE, "feat_extract_norm": "group"},
        _audio(mask=False),
        SAMPLES,
    ),
]

SIGLIP_TEXT = 16
"""SigLIP users pad their text to max length (64 in the real models, 16 here)."""

MULTIMODAL = [
    _family(
        "clip",
        "multimodal",
        "CLIPModel",
        {
            "text_config": _heads(
                32, 2, pad_token_id=1, bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1
            ),
            "vision_config": VIT_LIKE,
            "projection_dim": 32,
        },
        _two_towers(_text(1, eos=VOCAB - 1)),
        fast=True,
    ),
    _family(
        "siglip",
        "multimodal",
        "SiglipModel",
        {
            "text_config": _heads(
                32,
                2,
                max_position_embeddings=SIGLIP_TEXT,
                pad_token_id=1,
                bos_token_id=None,
                eos_token_id=1,
            ),
            "vision_config": VIT_LIKE,
        },
        _two_towers(_text(1, eos=1, mask=False)),
        (SIGLIP_TEXT, SIGLIP_TEXT),
    ),
]

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in [
        *DECODERS,
        *CAUSAL_LMS,
        *ENCODERS,
        *SEQ2SEQ,
        *VISION,
        *AUDIO,
        *MULTIMODAL,
        *SECOND_ROUND,
    ]
}
