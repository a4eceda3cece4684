"""Loading checkpoints for the in-process backend: a directory or hub id, a multimodal fallback, LoRA adapters.

Everything here takes the already-imported ``transformers`` module, so importing this file stays light.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .base import BackendError


def load_checkpoint(transformers: Any, path_or_id: str, torch_dtype: Any) -> tuple[Any, Any]:
    """(model, tokenizer) from a model directory, a hub id or a LoRA adapter directory (its base model with the
    adapter folded in); a failure raises :class:`BackendError` saying what to do."""
    source = _source(path_or_id)
    base = adapter_base(source)
    try:
        if base is None:
            return _load_model(transformers, source, torch_dtype), transformers.AutoTokenizer.from_pretrained(source)
        has_tokenizer = (Path(source) / "tokenizer_config.json").exists()
        tokenizer = transformers.AutoTokenizer.from_pretrained(source if has_tokenizer else base)
        return _merge_adapter(_load_model(transformers, _source(base), torch_dtype), source), tokenizer
    except OSError as e:
        raise BackendError(_load_hint(base or path_or_id, e)) from None


def torch_dtype(torch: Any, dtype: str | None, device: str) -> Any:
    """The torch dtype named by ``dtype``, or the default for ``device`` (bfloat16 on a GPU that has it, else
    float32)."""
    names = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
    if dtype is None:
        gpu_bf16 = device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if gpu_bf16 else torch.float32
    if dtype not in names:
        raise ValueError(f"dtype must be one of {', '.join(names)}; got {dtype!r}")
    return names[dtype]


def _source(path_or_id: str) -> str:
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return str(path)
    looks_local = path_or_id.startswith((".", "/", "~")) or path_or_id.count("/") > 1
    if looks_local and not path.exists():
        raise BackendError(f"no model directory at {path}: pass a directory holding config.json and the weights")
    return path_or_id


def adapter_base(source: str) -> str | None:
    """The base model a LoRA adapter directory was trained from (``nego train --finetune lora`` writes one), or
    None when ``source`` is a full checkpoint."""
    config = Path(source) / "adapter_config.json"
    if not config.is_file():
        return None
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise BackendError(f"{config}: unreadable adapter config ({e})") from None
    if not base:
        raise BackendError(f"{config} names no base_model_name_or_path; the adapter cannot be loaded without its base")
    return str(base)


def _merge_adapter(model: Any, adapter_dir: str) -> Any:
    """Apply a LoRA adapter and fold it into the weights, so that serving costs what the base model costs."""
    try:
        from peft import PeftModel
    except ModuleNotFoundError:
        raise BackendError(f"{adapter_dir} is a LoRA adapter, which needs peft: pip install 'nego[train]'") from None
    return PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()


def _load_model(transformers: Any, source: str, torch_dtype: Any) -> Any:
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    except ValueError as causal_error:
        # a multimodal checkpoint with no causal-LM mapping: drive its text path through the image-text class
        try:
            return transformers.AutoModelForImageTextToText.from_pretrained(source, dtype=torch_dtype)
        except ValueError:
            raise BackendError(
                f"{source}: not a causal or image-text-to-text language model ({causal_error})"
            ) from None


def _load_hint(path_or_id: str, error: OSError) -> str:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        how = (
            "HF_HUB_OFFLINE is set, so only the local cache is searched: download it first "
            f"(`hf download {path_or_id}`) on a machine with network, or pass a local directory"
        )
    else:
        how = "check the hub id (and HF_TOKEN for gated models) or pass a local directory"
    return f"could not load model {path_or_id!r}: {how}. ({type(error).__name__}: {str(error)[:300]})"
