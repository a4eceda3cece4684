"""Loading real chat models (Gemma 4 sizes or any local Hugging Face checkpoint) for GRPO, with clear errors."""

from __future__ import annotations

import importlib.util
from typing import Any

from .config import GEMMA_SIZES, ConfigError, TrainConfig


def model_source(cfg: TrainConfig) -> str:
    """Hub id or local path of the checkpoint to train."""
    return GEMMA_SIZES.get(cfg.model) or cfg.model.removeprefix("hf:")


def check_environment(cfg: TrainConfig) -> None:
    """Fail before loading anything when the run cannot work here (no GPU for Gemma, vLLM requested but absent)."""
    import torch

    if cfg.model in GEMMA_SIZES and not torch.cuda.is_available():
        raise ConfigError(f"model {cfg.model!r} ({GEMMA_SIZES[cfg.model]}) needs a CUDA GPU; none is visible")
    if cfg.use_vllm and importlib.util.find_spec("vllm") is None:
        raise ConfigError("use_vllm needs vLLM on a GPU machine: pip install 'nego[train,vllm]'")
    if cfg.use_vllm and not torch.cuda.is_available():
        raise ConfigError("use_vllm needs a CUDA GPU")


def load_chat_model(cfg: TrainConfig) -> tuple[Any, Any]:
    """(model, tokenizer) in bf16 on a GPU (fp32 on CPU); the tokenizer must carry a prefix-preserving chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .chat_rollout import user_suffix_ids

    check_environment(cfg)
    source = model_source(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32
        )
    except OSError as e:
        raise ConfigError(
            f"cannot load checkpoint {source!r}: {e}. Download it first (hf download {source}) or pass hf:PATH"
        ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"{source}: the tokenizer has no chat template; chat-format training needs one")
    user_suffix_ids(tokenizer, "check")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
