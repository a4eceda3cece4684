"""How to serve a registered chat model with vLLM so that ``--sellers NAME`` reaches it through ``NEGO_VLLM_URL``.

A registered chat model is requested from the server under its registry path, so the server must expose exactly
that name: a full checkpoint is served from its directory (vLLM names it by the path it was given); a LoRA adapter
(``nego train --finetune lora``) is served on its base model as a LoRA module named by the adapter's path.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..model_registry import ModelEntry
from .backends.base import BackendError
from .backends.hf_loading import adapter_base


def vllm_serve_args(entry: ModelEntry) -> list[str]:
    """The ``vllm serve`` command line for ``entry``; a ValueError says why a model cannot be served."""
    if entry.format != "hf":
        raise ValueError(f"model {entry.name!r} is a compact model: it plays in process, there is nothing to serve")
    try:
        base = adapter_base(entry.path)
    except BackendError as e:
        raise ValueError(str(e)) from None
    if base is None:
        return ["vllm", "serve", entry.path]
    if "=" in entry.path:
        raise ValueError(f"adapter path {entry.path!r} contains '='; vLLM's --lora-modules NAME=PATH cannot carry it")
    rank = json.loads((Path(entry.path) / "adapter_config.json").read_text()).get("r", 16)
    return [
        "vllm",
        "serve",
        base,
        "--enable-lora",
        "--max-lora-rank",
        str(rank),
        "--lora-modules",
        f"{entry.path}={entry.path}",
    ]


def vllm_serve_command(entry: ModelEntry) -> str:
    """:func:`vllm_serve_args` as one shell-quoted line."""
    return shlex.join(vllm_serve_args(entry))
