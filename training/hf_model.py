"""Loading real chat models (Gemma 4 sizes or any local Hugging Face checkpoint) for GRPO, with clear errors."""

from __future__ import annotations

import importlib.util
from typing import Any

from nego.agents.llm.backends.base import BackendError
from nego.agents.llm.backends.hf_loading import gpu_visible, resolve_source
from nego.agents.model_specs import SMOLLM2

from .config import GEMMA_SIZES, ConfigError, TrainConfig

ON_CPU = "on a CPU, train the built-in tiny seller (--model tiny) or a small local chat checkpoint (--model hf:PATH)"


def model_source(cfg: TrainConfig) -> str:
    """Hub id or local path of the checkpoint to train (``smollm2``: the packaged model's converted folder, made on
    first use)."""
    if cfg.model == SMOLLM2:
        from nego.agents.llm.backends.smollm2 import smollm2_source

        try:
            return smollm2_source()
        except BackendError as e:
            raise ConfigError(f"model: {SMOLLM2}: {e}") from None
    return GEMMA_SIZES.get(cfg.model) or cfg.model.removeprefix("hf:")


def check_environment(cfg: TrainConfig) -> None:
    """Fail before loading anything when the run cannot work here (no GPU for Gemma, vLLM requested but absent);
    a CPU-only torch build is recognised without importing torch."""
    gpu = gpu_visible()
    if cfg.model in GEMMA_SIZES and not gpu:
        hub_id = GEMMA_SIZES[cfg.model]
        raise ConfigError(f"model {cfg.model!r} ({hub_id}) needs a CUDA GPU and none is visible; {ON_CPU}")
    if cfg.use_vllm and importlib.util.find_spec("vllm") is None:
        raise ConfigError("use_vllm needs vLLM on a GPU machine: pip install 'nego[train,vllm]'")
    if cfg.use_vllm and not gpu:
        raise ConfigError("use_vllm needs a CUDA GPU; none is visible")


def checkpoint_source(cfg: TrainConfig) -> tuple[str, bool]:
    """(path or hub id, load from local files only) of the checkpoint, or ConfigError saying what to do: a missing
    local directory says so; a hub id that is neither cached nor downloadable (``HF_HUB_OFFLINE``, no network)
    says how to get it."""
    try:
        source = resolve_source(model_source(cfg))
    except BackendError as e:
        raise ConfigError(f"model: {e}") from None
    return source.path_or_id, source.local_only


def load_chat_tokenizer(cfg: TrainConfig) -> Any:
    """The checkpoint's tokenizer, which must carry a prefix-preserving chat template (loaded before the weights, so
    the preflight can measure episodes with it)."""
    check_environment(cfg)
    source, local_only = checkpoint_source(cfg)
    from transformers import AutoTokenizer

    from .chat_rollout import user_suffix_ids

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    except OSError as e:
        raise ConfigError(f"cannot load the tokenizer of {source!r}: {e}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"{source}: the tokenizer has no chat template; chat-format training needs one")
    user_suffix_ids(tokenizer, "check")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_chat_weights(cfg: TrainConfig) -> Any:
    """The checkpoint's model in bf16 on a GPU (fp32 on CPU)."""
    source, local_only = checkpoint_source(cfg)
    import torch
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(
            source, dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32, local_files_only=local_only
        )
    except OSError as e:
        raise ConfigError(f"cannot load checkpoint {source!r}: {e}") from None


def load_chat_model(cfg: TrainConfig) -> tuple[Any, Any]:
    """(model, tokenizer): see :func:`load_chat_tokenizer` and :func:`load_chat_weights`."""
    tokenizer = load_chat_tokenizer(cfg)
    return load_chat_weights(cfg), tokenizer
