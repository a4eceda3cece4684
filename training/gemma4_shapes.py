"""Gemma 4 model configurations built from the published shapes, so plans and benchmarks need no download.

Where each number comes from:

- ``2.3b`` (E2B), ``4.5b`` (E4B), ``31b``: the variant table of transformers' Gemma 4 conversion script
  (``src/transformers/models/gemma4/convert_gemma4_weights.py``, the script that produced the released
  checkpoints). E2B and E4B also agree with gemma.cpp's configs (35 layers at width 1536 with a 4:1 sliding:global
  pattern; 42 layers at width 2560 with 5:1) and NVIDIA Megatron-Bridge's E4B recipe (8 heads, 2 KV heads, global
  head dim 512, KV shared across the last 18 layers, per-layer embeddings of 256).
- ``12b``: the variant table of ``convert_gemma4_unified_weights.py``: the 12B is a ``gemma4_unified`` model (no
  vision or audio encoder towers; images and audio enter through linear projections), with the default
  ``Gemma4UnifiedVisionConfig`` / ``Gemma4UnifiedAudioConfig`` of ``configuration_gemma4_unified.py``.
- Everything not listed here takes the defaults that ``configuration_gemma4.py`` documents: vocabulary 262,144
  (also the per-layer-embedding vocabulary), sliding window 512 (1024 where listed), global head dim 512, RoPE
  theta 10k on sliding layers and 1M with proportional partial rotation 0.25 on global ones, tied embeddings.

The attention pattern is five sliding-window layers then one full-attention layer, repeated (E2B: four then one):
in E4B the full-attention layers are 5, 11, ..., 41. ``AutoModelForCausalLM`` maps ``gemma4`` to
``Gemma4ForConditionalGeneration`` and ``gemma4_unified`` to ``Gemma4UnifiedForConditionalGeneration``: the classes
``nego`` loads, towers included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import GEMMA_SIZES

VOCAB = 262_144
SLIDING, FULL = "sliding_attention", "full_attention"
_ROPE = {
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
}
_ON_DEVICE_VISION = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "global_head_dim": 64,
    "pooling_kernel_size": 3,
    "use_clipped_linears": True,
}
_LARGE_VISION = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 72,
    "global_head_dim": 72,
    "pooling_kernel_size": 3,
    "use_clipped_linears": False,
    "standardize": True,
}


@dataclass(frozen=True)
class Gemma4Shape:
    """One published size: the nego alias, the hub id, the model type and the sub-config fields that differ from
    transformers' defaults. ``period`` is the attention pattern's length (sliding layers, then one global)."""

    alias: str
    label: str
    model_type: str
    period: int
    text: dict[str, Any]
    vision: dict[str, Any] | None = None
    audio: dict[str, Any] | None = field(default=None)

    @property
    def hub_id(self) -> str:
        return GEMMA_SIZES[self.alias]

    @property
    def layers(self) -> int:
        return int(self.text["num_hidden_layers"])


SHAPES: dict[str, Gemma4Shape] = {
    "2.3b": Gemma4Shape(
        "2.3b",
        "E2B",
        "gemma4",
        5,
        {
            "hidden_size": 1536,
            "hidden_size_per_layer_input": 256,
            "intermediate_size": 4 * 1536,
            "num_hidden_layers": 35,
            "num_attention_heads": 8,
            "num_key_value_heads": 1,
            "num_kv_shared_layers": 20,
            "use_double_wide_mlp": True,
        },
        _ON_DEVICE_VISION,
        {},
    ),
    "4.5b": Gemma4Shape(
        "4.5b",
        "E4B",
        "gemma4",
        6,
        {
            "hidden_size": 2560,
            "hidden_size_per_layer_input": 256,
            "intermediate_size": 4 * 2560,
            "num_hidden_layers": 42,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "num_kv_shared_layers": 18,
        },
        _ON_DEVICE_VISION,
        {},
    ),
    "12b": Gemma4Shape(
        "12b",
        "12B",
        "gemma4_unified",
        6,
        {
            "hidden_size": 3840,
            "intermediate_size": 4 * 3840,
            "num_hidden_layers": 48,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "num_global_key_value_heads": 1,
            "attention_k_eq_v": True,
            "use_bidirectional_attention": "vision",
            "sliding_window": 1024,
        },
        {},
        {},
    ),
    "31b": Gemma4Shape(
        "31b",
        "31B",
        "gemma4",
        6,
        {
            "hidden_size": 5376,
            "hidden_size_per_layer_input": 0,
            "intermediate_size": 4 * 5376,
            "num_hidden_layers": 60,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "num_global_key_value_heads": 4,
            "attention_k_eq_v": True,
            "use_bidirectional_attention": "vision",
            "sliding_window": 1024,
            "max_position_embeddings": 262_144,
        },
        _LARGE_VISION,
        None,
    ),
}


def layer_types(layers: int, period: int) -> list[str]:
    """``period - 1`` sliding-window layers then one full-attention layer, repeated: layer i is global when
    ``i % period == period - 1``."""
    return [FULL if i % period == period - 1 else SLIDING for i in range(layers)]


def shape_for(alias: str) -> Gemma4Shape:
    try:
        return SHAPES[alias]
    except KeyError:
        raise ValueError(f"no published Gemma 4 shape {alias!r}; known: {', '.join(SHAPES)}") from None


def text_fields(shape: Gemma4Shape, layers: int | None = None) -> dict[str, Any]:
    """The text config's fields, optionally cut to ``layers`` layers (a whole number of attention periods; the
    KV-shared tail shrinks in proportion, keeping at least one full period of layers that own their caches)."""
    text = {"vocab_size": VOCAB, "final_logit_softcapping": 30.0, "rope_parameters": _ROPE, **shape.text}
    full = shape.layers
    n = full if layers is None else layers
    if n < shape.period or n % shape.period or n > full:
        raise ValueError(
            f"{shape.label}: layers must be a multiple of its attention period {shape.period} in "
            f"{shape.period}..{full}, got {n}"
        )
    shared = int(text.get("num_kv_shared_layers", 0))
    if shared and n != full:
        shared = min(shared * n // full, n - shape.period)
    text.update(num_hidden_layers=n, layer_types=layer_types(n, shape.period))
    if "num_kv_shared_layers" in text:
        text["num_kv_shared_layers"] = shared
    if shape.model_type == "gemma4":
        text["vocab_size_per_layer_input"] = VOCAB
    return text


def build_config(alias: str, layers: int | None = None) -> Any:
    """A transformers config of the published shape of ``alias`` (``2.3b``, ``4.5b``, ``12b``, ``31b``), optionally
    with fewer layers; builds in well under a second and downloads nothing."""
    shape = shape_for(alias)
    text = text_fields(shape, layers)
    if shape.model_type == "gemma4_unified":
        from transformers import Gemma4UnifiedConfig

        return Gemma4UnifiedConfig(text_config=text, vision_config=shape.vision, audio_config=shape.audio)
    from transformers import Gemma4Config

    return Gemma4Config(text_config=text, vision_config=shape.vision, audio_config=shape.audio)


def tiny_config(vocab_size: int, *, eos_token_id: int, pad_token_id: int, bos_token_id: int) -> Any:
    """A Gemma 4 (E-series) config small enough for a CPU: 12 text layers in the published 5:1 pattern, the last 6
    sharing KV caches, width 64, per-layer embeddings of 16, tiny vision and audio towers (for smoke runs)."""
    from transformers import Gemma4Config

    text = {
        "vocab_size": vocab_size,
        "vocab_size_per_layer_input": vocab_size,
        "hidden_size": 64,
        "hidden_size_per_layer_input": 16,
        "intermediate_size": 128,
        "num_hidden_layers": 12,
        "layer_types": layer_types(12, 6),
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "global_head_dim": 32,
        "num_kv_shared_layers": 6,
        "final_logit_softcapping": 30.0,
        "rope_parameters": _ROPE,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "bos_token_id": bos_token_id,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 16,
    }
    audio = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "output_proj_dims": 32}
    return Gemma4Config(text_config=text, vision_config=vision, audio_config=audio, tie_word_embeddings=True)
