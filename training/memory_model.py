"""Memory of a GRPO run on a GPU or a CPU, by arithmetic on the model's shape: nothing is allocated.

The model is built on the meta device from its config (parameters have shapes, no storage), which gives exact
parameter counts, the LoRA parameters ``target_modules="all-linear"`` adds, and each layer's key-value width. The
byte counts then follow from how this stack trains:

- weights in bf16 (2 bytes per parameter), as ``nego`` loads real models on a GPU;
- full fine-tuning: bf16 gradients and AdamW's two moments created like the parameters (``torch.optim.AdamW``
  uses ``zeros_like``), so 2 + 2 + 2 + 2 = 8 bytes per trained parameter; the Trainer's bf16 mode autocasts a bf16
  model and keeps no fp32 master copy. Vision and audio towers never receive gradients in text-only training, so
  they cost only their weights;
- LoRA: frozen bf16 weights, adapters in fp32 (PEFT upcasts adapters of a bf16 model), fp32 gradients and
  moments: 16 bytes per adapter parameter;
- training activations of one micro-batch with gradient checkpointing: the hidden state saved at every layer
  boundary, the per-layer embedding inputs, one layer's recomputed activations and their gradients, and the
  micro-batch's logits over the vocabulary in fp32 (an upper bound: TRL 1.16 scores log-probs in tiles);
- rollouts through transformers (``agents.llm.backends.hf_engine``): each row's key-value cache (sliding-window
  layers keep at most the window), the prefill's logits for every position of every row in bf16 plus the
  soft-capped copy (an upper bound: the engine asks for the last position's logits where the model takes
  ``logits_to_keep``), and one layer's prefill activations. Gradients are freed between steps; weights and optimizer
  states stay through the rollouts.

On a CPU (``on_cpu``) the same parts are counted the way this stack runs there, in fp32 (4 bytes per value):

- weights fp32, full fine-tuning's gradients fp32 and AdamW's moments fp32: 4 + 4 + 8 = 16 bytes per parameter;
- training activations as above at 4 bytes, plus what a CPU keeps that a GPU does not: the recomputed layer's
  attention scores, probabilities and their gradient (the CPU kernel materialises them when a padding mask is
  given), and TRL's fused LM head, which without Triton scores every position in tiles of
  :data:`HEAD_TILE_TOKENS` x :data:`HEAD_TILE_VOCAB` and keeps :data:`HEAD_TILE_COPIES` such tiles alive at once
  instead of the full logits;
- generation (``agents.llm.backends.hf_engine`` on a CPU reads each prompt alone, then decodes all rows together in
  one static cache): every row's key-value cache twice (the row's own states and the merged static cache hold them
  at once), the engine's store of reusable prompt states (:func:`prefix_store_bytes`, the engine's own sizing) and
  each row's last-position logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GiB = 2**30
MiB = 2**20
WEIGHT_BYTES = 2
CPU_FLOAT_BYTES = 4
HEAD_TILE_TOKENS, HEAD_TILE_VOCAB = 4096, 32768
"""TRL 1.16's fused LM head (``trl.kernels.chunked_logprob``): tokens per projection tile and the vocabulary width
``trl.trainer.utils`` passes as its chunk."""
HEAD_TILE_COPIES = 8
"""Tiles of the fused head alive at once on a CPU, where the fold runs as torch ops on the tile (its buffer and the
fold's temporaries): the smallest count at which the estimate bounds the peak resident memory of SmolLM2 forward
and backward passes of 1-8 rows of 1,100-4,000 tokens (bench/results/smollm2_memory.txt)."""
FULL_TRAINED_BYTES = 6  # gradient + two AdamW moments, bf16
LORA_BYTES = 16  # fp32 adapter weight, gradient, two moments


@dataclass(frozen=True, slots=True)
class CacheLayer:
    """A decoder layer that keeps its own key-value cache: the key width (heads x head dim) and its window
    (0 = full attention)."""

    kv_width: int
    window: int


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the estimate needs to know about a model, read off a meta-device instance of it."""

    model_class: str
    total: int
    text: int
    lora_per_rank: int
    hidden: int
    layers: int
    vocab: int
    widest_mlp: int
    widest_q: int
    per_layer_input: int
    cache_layers: tuple[CacheLayer, ...]
    heads: int = 0
    """Attention (query) heads per layer."""

    def lora(self, rank: int) -> int:
        return self.lora_per_rank * rank

    @property
    def towers(self) -> int:
        return self.total - self.text


def model_facts(model_config: Any) -> ModelFacts:
    """Build the model of ``model_config`` on the meta device with ``AutoModelForCausalLM`` (the class ``nego``
    loads) and read its sizes; about a second for Gemma 4 E4B, no memory allocated."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    text_cfg = model_config.get_text_config()
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    text = sum(p.numel() for p in decoder.parameters())
    if head is not None and head.weight is not model.get_input_embeddings().weight:
        text += head.weight.numel()
    widest_mlp = widest_q = 0
    caches = []
    for layer in decoder.layers:
        attn = layer.self_attn
        widest_q = max(widest_q, attn.q_proj.out_features)
        mlp = layer.mlp
        widest_mlp = max(widest_mlp, getattr(mlp, "up_proj", getattr(mlp, "gate_proj", None)).out_features)
        if getattr(attn, "is_kv_shared_layer", False):
            continue
        sliding = bool(getattr(attn, "is_sliding", False) or getattr(attn, "sliding_window", None))
        window = int(getattr(text_cfg, "sliding_window", 0) or 0) if sliding else 0
        caches.append(CacheLayer(attn.k_proj.out_features, window))
    ple = int(getattr(text_cfg, "hidden_size_per_layer_input", 0) or 0) * int(text_cfg.num_hidden_layers)
    return ModelFacts(
        model_class=type(model).__name__,
        total=sum(p.numel() for p in model.parameters()),
        text=text,
        lora_per_rank=_lora_per_rank(model, head),
        hidden=int(text_cfg.hidden_size),
        layers=int(text_cfg.num_hidden_layers),
        vocab=int(text_cfg.vocab_size),
        widest_mlp=widest_mlp,
        widest_q=widest_q,
        per_layer_input=ple,
        cache_layers=tuple(caches),
        heads=int(getattr(text_cfg, "num_attention_heads", 0) or 0),
    )


def _lora_per_rank(model: Any, head: Any) -> int:
    """LoRA parameters per unit of rank under PEFT's ``all-linear``: every ``nn.Linear`` but the output head,
    each adding ``rank * (in + out)``."""
    from torch import nn

    return sum(m.in_features + m.out_features for m in model.modules() if isinstance(m, nn.Linear) and m is not head)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes of one GRPO process on one GPU, by part; ``peak`` is the larger of the training step and the
    rollouts, each on top of the weights, the optimizer states and what a colocated vLLM engine reserves."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    generation: int
    reserved: int = 0

    @property
    def training(self) -> int:
        return self.weights + self.optimizer + self.reserved + self.gradients + self.activations

    @property
    def rollouts(self) -> int:
        return self.weights + self.optimizer + self.reserved + self.generation

    @property
    def peak(self) -> int:
        return max(self.training, self.rollouts)

    def describe(self) -> str:
        g = [x / GiB for x in (self.weights, self.gradients, self.optimizer, self.activations, self.generation)]
        vllm = f" + vLLM {self.reserved / GiB:.1f}" if self.reserved else ""
        return (
            f"weights {g[0]:.1f} + gradients {g[1]:.1f} + optimizer {g[2]:.1f}{vllm} GiB; "
            f"training step +{g[3]:.1f} activations = {self.training / GiB:.1f} GiB; "
            f"rollouts +{g[4]:.1f} generation = {self.rollouts / GiB:.1f} GiB"
        )


def state_bytes(facts: ModelFacts, finetune: str, lora_rank: int, *, on_cpu: bool = False) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes for ``full`` or ``lora`` fine-tuning."""
    value = CPU_FLOAT_BYTES if on_cpu else WEIGHT_BYTES
    weights = value * facts.total
    if finetune == "full":
        return weights, value * facts.text, 2 * value * facts.text
    adapters = facts.lora(lora_rank)
    return weights + 4 * adapters, 4 * adapters, 8 * adapters


def activation_bytes(facts: ModelFacts, micro_batch: int, seq_len: int, *, on_cpu: bool = False) -> int:
    """One micro-batch's training activations with gradient checkpointing (see the module docstring)."""
    value = CPU_FLOAT_BYTES if on_cpu else 2
    tokens = micro_batch * seq_len
    checkpoints = facts.layers * tokens * facts.hidden * value
    per_layer_inputs = tokens * facts.per_layer_input * value
    # one layer recomputed for its backward: norms and residuals (~6 hidden), q/k/v/o, the gated MLP (~4 widest),
    # saved and matched by their gradients
    kv = max((c.kv_width for c in facts.cache_layers), default=facts.widest_q)
    layer = tokens * (6 * facts.hidden + 2 * facts.widest_q + 2 * kv + 4 * facts.widest_mlp) * value * 2
    if not on_cpu:
        return checkpoints + per_layer_inputs + layer + tokens * facts.vocab * 4
    heads = facts.heads or 1
    scores = micro_batch * heads * seq_len * seq_len * value * 3
    head = min(tokens, HEAD_TILE_TOKENS) * min(facts.vocab, HEAD_TILE_VOCAB) * value * HEAD_TILE_COPIES
    return checkpoints + per_layer_inputs + layer + scores + head


def kv_cache_bytes(facts: ModelFacts, rows: int, seq_len: int, *, on_cpu: bool = False) -> int:
    """Key-value cache of ``rows`` sequences of ``seq_len`` tokens (keys and values; bf16, fp32 on a CPU)."""
    per_token = sum(c.kv_width * (min(seq_len, c.window) if c.window else seq_len) for c in facts.cache_layers)
    return rows * per_token * 2 * (CPU_FLOAT_BYTES if on_cpu else 2)


def prefix_store_bytes(facts: ModelFacts, rows: int) -> int:
    """What the generation engine's store of reusable prompt states may hold for ``rows`` negotiations in flight
    (its own rule, ``hf_engine.prefix_budget_mb``, on fp32 states)."""
    from nego.agents.llm.backends.hf_engine import MAX_PREFIX_MB, MIN_PREFIX_MB, PREFIX_TOKENS_PER_ROW

    per_token = kv_cache_bytes(facts, 1, 1, on_cpu=True)
    return int(min(MAX_PREFIX_MB * MiB, max(MIN_PREFIX_MB * MiB, rows * PREFIX_TOKENS_PER_ROW * per_token)))


def generation_bytes(facts: ModelFacts, rows: int, seq_len: int, *, on_cpu: bool = False) -> int:
    """Rollouts through transformers with ``rows`` sequences read at once (see the module docstring)."""
    tokens = rows * seq_len
    if on_cpu:
        cache = 2 * kv_cache_bytes(facts, rows, seq_len, on_cpu=True)
        return cache + prefix_store_bytes(facts, rows) + rows * facts.vocab * CPU_FLOAT_BYTES * 2
    logits = tokens * facts.vocab * 2 * 2
    prefill = tokens * (4 * facts.hidden + 2 * facts.widest_mlp) * 2
    return kv_cache_bytes(facts, rows, seq_len) + logits + prefill


def estimate(
    facts: ModelFacts,
    finetune: str,
    lora_rank: int,
    *,
    micro_batch: int,
    seq_len: int,
    generation_rows: int,
    vllm_reserved: int = 0,
    on_cpu: bool = False,
) -> MemoryEstimate:
    """Bytes of a run with these choices; ``vllm_reserved`` is what a colocated vLLM engine holds all along (its own
    weights and cache); ``generation_rows`` are the rows transformers reads at once (dev evaluations use it even
    when vLLM generates the rollouts); ``on_cpu`` counts a CPU run (see the module docstring)."""
    weights, gradients, optimizer = state_bytes(facts, finetune, lora_rank, on_cpu=on_cpu)
    return MemoryEstimate(
        weights,
        gradients,
        optimizer,
        activation_bytes(facts, micro_batch, seq_len, on_cpu=on_cpu),
        generation_bytes(facts, generation_rows, seq_len, on_cpu=on_cpu),
        vllm_reserved,
    )
