"""Loading checkpoints for the in-process backend: a directory or hub id, a multimodal fallback, LoRA adapters.

Where a checkpoint comes from is settled before anything large loads (:func:`resolve_source`): a local directory;
a hub id found in the local cache (loaded from there when ``HF_HUB_OFFLINE`` is set or the hub cannot be reached,
instead of retrying the network for a minute); or a hub id to download, after one quick check that the hub
answers. Everything here takes the already-imported ``transformers`` module, so importing this file stays light.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import BackendError

HUB_PROBE_TIMEOUT_S = 5.0
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True, slots=True)
class Source:
    """A checkpoint to load: a local directory or a hub id; ``local_only`` forbids network access while loading."""

    path_or_id: str
    local_only: bool


def load_checkpoint(transformers: Any, path_or_id: str, torch_dtype: Any) -> tuple[Any, Any]:
    """(model, tokenizer) from a model directory, a hub id or a LoRA adapter directory (its base model with the
    adapter folded in); a failure raises :class:`BackendError` saying what to do."""
    source = resolve_source(path_or_id)
    base = adapter_base(source.path_or_id)
    try:
        if base is None:
            model = _load_model(transformers, source, torch_dtype)
            return model, _load_tokenizer(transformers, source)
        base_source = resolve_source(base)
        has_tokenizer = (Path(source.path_or_id) / "tokenizer_config.json").exists()
        tokenizer = _load_tokenizer(transformers, source if has_tokenizer else base_source)
        return _merge_adapter(_load_model(transformers, base_source, torch_dtype), source.path_or_id), tokenizer
    except OSError as e:
        raise BackendError(_load_hint(base or path_or_id, e)) from None


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) asks for the local cache only."""
    return any(os.environ.get(k, "").upper() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def gpu_visible() -> bool:
    """True when torch sees a GPU. A CPU-only torch build (version ``+cpu``) answers without importing torch."""
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        if importlib.metadata.version("torch").endswith("+cpu"):
            return False
    except importlib.metadata.PackageNotFoundError:
        pass
    import torch

    return bool(torch.cuda.is_available())


def resolve_source(path_or_id: str) -> Source:
    """Where ``path_or_id`` loads from, or :class:`BackendError` naming what to do; touches the network at most
    once (a short hub query, never when ``HF_HUB_OFFLINE`` is set)."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return Source(str(path), True)
    looks_local = path_or_id.startswith((".", "/", "~")) or path_or_id.count("/") > 1 or path.exists()
    if looks_local:
        raise BackendError(
            f"no model directory at {path_or_id}: it does not exist or is not a directory; pass a directory "
            "holding config.json and the weights (a hub id looks like org/name)"
        )
    cached = in_hub_cache(path_or_id)
    if hub_offline():
        if cached:
            return Source(path_or_id, True)
        raise BackendError(
            f"{path_or_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: download it on a "
            f"machine with network (`hf download {path_or_id}`), or pass a local directory (hf:PATH)"
        )
    unreachable = probe_hub(path_or_id)
    if unreachable is None:
        return Source(path_or_id, False)
    if cached:
        return Source(path_or_id, True)
    raise BackendError(
        f"{path_or_id} is not in the local Hugging Face cache and the hub cannot be reached ({unreachable}): "
        f"download it on a machine with network (`hf download {path_or_id}`), or pass a local directory (hf:PATH)"
    )


def in_hub_cache(repo_id: str) -> bool:
    """True when the local Hugging Face cache holds ``repo_id``'s config (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ModuleNotFoundError:
        return False
    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def probe_hub(repo_id: str, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """None if the hub answers for ``repo_id`` within ``timeout_s``; otherwise why not. A missing or gated repo is a
    BackendError."""
    try:
        from huggingface_hub import model_info
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ModuleNotFoundError as e:
        return f"{e.name} is not installed"
    try:
        model_info(repo_id, timeout=timeout_s)
    except GatedRepoError:
        raise BackendError(f"{repo_id} is gated: accept its terms on the hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise BackendError(
            f"{repo_id}: no such model on the hub (or it is private: set HF_TOKEN); check the id, or pass a "
            "local directory"
        ) from None
    except Exception as e:  # HTTP errors and the transport layer's own (DNS, refused, timeout), which differ by client
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None


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


def _load_tokenizer(transformers: Any, source: Source) -> Any:
    return transformers.AutoTokenizer.from_pretrained(source.path_or_id, local_files_only=source.local_only)


def _load_model(transformers: Any, source: Source, torch_dtype: Any) -> Any:
    where = {"dtype": torch_dtype, "local_files_only": source.local_only}
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(source.path_or_id, **where)
    except ValueError as causal_error:
        # a multimodal checkpoint with no causal-LM mapping: drive its text path through the image-text class
        try:
            return transformers.AutoModelForImageTextToText.from_pretrained(source.path_or_id, **where)
        except ValueError:
            raise BackendError(
                f"{source.path_or_id}: not a causal or image-text-to-text language model ({causal_error})"
            ) from None


def _load_hint(path_or_id: str, error: OSError) -> str:
    if hub_offline():
        how = (
            "HF_HUB_OFFLINE is set, so only the local cache is searched: download it first "
            f"(`hf download {path_or_id}`) on a machine with network, or pass a local directory"
        )
    else:
        how = "check the hub id (and HF_TOKEN for gated models) or pass a local directory"
    return f"could not load model {path_or_id!r}: {how}. ({type(error).__name__}: {str(error)[:300]})"
