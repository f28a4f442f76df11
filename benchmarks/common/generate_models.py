"""The causal LMs ``benchmarks.generate`` measures, built from configs with random weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def configs(device: str, quick: bool) -> dict[str, Callable[[], Any]]:
    """Model builders by name (``quick``: tiny versions of each, for a smoke run)."""
    import transformers

    big = device == "cuda" and not quick

    def gpt2() -> Any:
        if big:
            return transformers.GPT2LMHeadModel(transformers.GPT2Config())
        layers, width, vocab = (2, 64, 500) if quick else (4, 256, 8000)
        config = transformers.GPT2Config(
            n_layer=layers, n_embd=width, n_head=4, vocab_size=vocab, n_positions=512
        )
        return transformers.GPT2LMHeadModel(config)

    def llama() -> Any:
        width, layers = (64, 2) if quick else (512, 4)
        return _llama(transformers, width, layers, 8, 2, 500 if quick else 32000)

    def t5() -> Any:
        width, layers = (32, 2) if quick else (512 if big else 256, 6 if big else 4)
        config = transformers.T5Config(
            vocab_size=500 if quick else 32128,
            d_model=width,
            d_kv=width // 8,
            d_ff=width * 4,
            num_layers=layers,
            num_decoder_layers=layers,
            num_heads=8,
            decoder_start_token_id=0,
        )
        return transformers.T5ForConditionalGeneration(config)

    def mistral_8l() -> Any:
        """8 layers d1024, grouped queries (32/8 heads); its default sliding_window=4096 makes
        its static cache sliding-window layers (issue 28's first model)."""
        width, layers, vocab = (64, 2, 500) if quick else (1024, 8, 32000)
        config = transformers.MistralConfig(
            vocab_size=vocab, hidden_size=width, intermediate_size=width * 7 // 2,
            num_hidden_layers=layers, num_attention_heads=8 if quick else 32,
            num_key_value_heads=2 if quick else 8, max_position_embeddings=4096,
        )  # fmt: skip
        return transformers.MistralForCausalLM(config)

    def qwen2_06b() -> Any:
        """24 layers d1024, 16 query heads on 2 key/value heads, vocabulary 151936 (0.6B)."""
        width, layers, vocab = (64, 2, 500) if quick else (1024, 24, 151936)
        config = transformers.Qwen2Config(
            vocab_size=vocab, hidden_size=width, intermediate_size=width * 11 // 4,
            num_hidden_layers=layers, num_attention_heads=4 if quick else 16,
            num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False,
        )  # fmt: skip
        return transformers.Qwen2ForCausalLM(config)

    def llama_05b() -> Any:
        """16 layers d1536, 24 query heads on 8 key/value heads, vocabulary 32000 (0.5B)."""
        if quick:
            return _llama(transformers, 64, 2, 8, 2, 500)
        return _llama(transformers, 1536, 16, 24, 8, 32000, intermediate=4096)

    def llama_01b() -> Any:
        """12 layers d768 (12 heads, no grouping), vocabulary 32000 (0.13B): the CPU's model."""
        if quick:
            return _llama(transformers, 64, 2, 4, 4, 500)
        return _llama(transformers, 768, 12, 12, 12, 32000, intermediate=2048)

    return {
        **_served_sizes(transformers, quick),
        "gpt2": gpt2,
        "llama": llama,
        "t5": t5,
        "mistral-8l": mistral_8l,
        "qwen2-0.6b": qwen2_06b,
        "llama-0.5b": llama_05b,
        "llama-0.1b": llama_01b,
    }


def _served_sizes(transformers: Any, quick: bool) -> dict[str, Callable[[], Any]]:
    """The shapes people serve in bf16 (0.6B to 8B), for the GPU's decode measurements."""

    def qwen3_06b() -> Any:
        """Qwen3-0.6B's shape: 28 layers d1024, 16 query heads on 8 key/value heads of 128,
        per-head query/key norms, vocabulary 151936, tied embeddings."""
        if quick:
            return _qwen3(transformers, 64, 2, 4, 2, 16, 500, 128)
        return _qwen3(transformers, 1024, 28, 16, 8, 128, 151936, 3072)

    def llama_1b() -> Any:
        """Llama-3.2-1B's shape: 16 layers d2048, 32 query heads on 8, vocabulary 128256, tied."""
        if quick:
            return _llama(transformers, 64, 2, 8, 2, 500)
        return _llama(transformers, 2048, 16, 32, 8, 128256, intermediate=8192, tied=True)

    def qwen25_3b() -> Any:
        """Qwen2.5-3B's shape: 36 layers d2048, 16 query heads on 2, vocabulary 151936, tied."""
        if quick:
            return _llama(transformers, 64, 2, 8, 2, 500)
        config = transformers.Qwen2Config(
            vocab_size=151936, hidden_size=2048, intermediate_size=11008,
            num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
            max_position_embeddings=4096, tie_word_embeddings=True,
        )  # fmt: skip
        return transformers.Qwen2ForCausalLM(config)

    def llama_8b() -> Any:
        """Llama-3-8B's shape: 32 layers d4096, 32 query heads on 8, vocabulary 128256."""
        if quick:
            return _llama(transformers, 64, 2, 8, 2, 500)
        return _llama(transformers, 4096, 32, 32, 8, 128256, intermediate=14336)

    return {
        "qwen3-0.6b": qwen3_06b,
        "llama-1b": llama_1b,
        "qwen2.5-3b": qwen25_3b,
        "llama-8b": llama_8b,
    }


def _llama(
    transformers: Any,
    width: int,
    layers: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    intermediate: int | None = None,
    tied: bool = False,
) -> Any:
    config = transformers.LlamaConfig(
        tie_word_embeddings=tied,
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=intermediate or width * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
    )
    return transformers.LlamaForCausalLM(config)


def _qwen3(
    transformers: Any,
    width: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    intermediate: int,
) -> Any:
    config = transformers.Qwen3Config(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    return transformers.Qwen3ForCausalLM(config)
