"""The tiny seller model: a Qwen2-shaped causal LM of a few million parameters, built from a config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TinyModelShape:
    """Transformer shape of the tiny model (defaults: about 1.8M parameters)."""

    hidden: int = 192
    layers: int = 4
    intermediate: int = 512
    heads: int = 4
    kv_heads: int = 2
    max_positions: int = 1024


def build_tiny_model(tokenizer: Any, shape: TinyModelShape | None = None, seed: int = 0) -> Any:
    """A randomly initialised ``Qwen2ForCausalLM`` sized for ``tokenizer`` (seeded, so builds are repeatable)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    s = shape or TinyModelShape()
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        max_position_embeddings=s.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
