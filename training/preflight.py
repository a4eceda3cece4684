"""Preflight for real models: before any weights load, decide the episode cap, the fine-tuning mode and the batch
layout that fit the GPU (or the CPU's memory budget), or refuse with the flag to change.

:func:`plan` is a pure function of (training config, model facts, episode lengths, GPU or CPU bytes): the model
facts come from the model's config on the meta device (:mod:`.memory_model`), the episode lengths from rule-seller
episodes rendered with the model's own tokenizer and chat template (:mod:`.episode_lengths`). Choices:

- ``max_tokens`` (the cap on an episode's tokens after its prompt): the measured 99th percentile plus a margin,
  unless given; a given cap below that percentile is refused (an episode over the cap stops training);
- fine-tuning: as given; otherwise full fine-tuning when its weights, gradients and optimizer states take at most
  half of the budget (the rest is for activations and rollouts; on one 48-80 GB GPU that means LoRA for E4B and
  up), else LoRA;
- one optimizer step still covers every sequence of the step (``scenarios_per_step * group_size``), split into
  micro-batches with gradient accumulation: TRL 1.16 derives ``steps_per_generation`` from
  ``gradient_accumulation_steps``, so ``rollout_func`` is called once per step with all the groups;
- rollouts and dev evaluations through transformers read at most ``generation_rows`` rows at once;
- without a GPU the budget is ``--memory-gb`` (default: :data:`CPU_AVAILABLE_SHARE` of the available RAM), less
  :data:`CPU_OVERHEAD`, and the memory model counts fp32 as a CPU run holds it;
- real models get no time budget unless one is given.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from .config import DEV_BUYERS, GEMMA_SIZES, ConfigError, TrainConfig
from .episode_lengths import EpisodeLengths, measure_episode_lengths
from .memory_model import GiB, MemoryEstimate, ModelFacts, estimate, kv_cache_bytes, model_facts, state_bytes

MARGIN = 0.25
"""Episode cap = measured p99 x (1 + MARGIN), rounded up to a multiple of CAP_STEP: room for the message and
prose a model writes around the JSON action that rule sellers leave out."""
CAP_STEP = 64
MAX_MICRO_BATCH = 8
USABLE = 0.92
"""Share of the free GPU memory a plan may fill; the rest (and CUDA_OVERHEAD) is for the allocator's fragmentation,
the CUDA context and kernels' workspaces."""
CUDA_OVERHEAD = 1 * GiB
TRL_VLLM_UTILIZATION = 0.3
FULL_STATE_SHARE = 0.5
CPU_AVAILABLE_SHARE = 0.8
CPU_OVERHEAD = 3 * GiB // 4
"""What a CPU training process holds besides the model's parts: the interpreter, torch, transformers, TRL and the
market (about 0.6 GiB measured at the first GRPO step of SmolLM2, bench/results/smollm2_memory.txt)."""


class PreflightError(ConfigError):
    """The run cannot work on this machine as configured; the message names the flag to change."""


@dataclass(frozen=True, slots=True)
class TrainPlan:
    """What a real-model run will do, decided before loading: apply it with :meth:`apply` (TrainConfig fields)
    and :meth:`grpo_overrides` (GRPOConfig fields); :meth:`describe` prints it."""

    model: str
    facts: ModelFacts
    lengths: EpisodeLengths
    finetune: str
    finetune_why: str
    lora_rank: int
    max_tokens: int
    max_tokens_why: str
    seq_len: int
    sequences: int
    micro_batch: int
    grad_accum: int
    generation_rows: int
    generation_rows_needed: int
    vllm_gpu_memory_utilization: float | None
    time_budget_min: float
    gpu_bytes: int | None
    memory: MemoryEstimate
    cpu_bytes: int | None = None
    cpu_source: str = ""
    """Where a CPU budget came from (``--memory-gb``, or the share of the available RAM)."""

    @property
    def budget(self) -> int | None:
        return plan_budget(self.gpu_bytes, self.cpu_bytes)

    @property
    def trainable(self) -> int:
        return self.facts.text if self.finetune == "full" else self.facts.lora(self.lora_rank)

    def apply(self, cfg: TrainConfig) -> TrainConfig:
        """``cfg`` with the planned episode cap, fine-tuning mode and time budget."""
        return replace(
            cfg,
            max_tokens=self.max_tokens,
            finetune=self.finetune,
            time_budget_min=self.time_budget_min,
            generation_rows=self.generation_rows,
        )

    def grpo_overrides(self) -> dict[str, Any]:
        """GRPOConfig fields: the micro-batch layout (one generation batch per optimizer step) and the vLLM share."""
        out: dict[str, Any] = {
            "per_device_train_batch_size": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "max_completion_length": self.max_tokens,
        }
        if self.vllm_gpu_memory_utilization is not None:
            out["vllm_gpu_memory_utilization"] = self.vllm_gpu_memory_utilization
        return out

    def describe(self) -> str:
        f, lg = self.facts, self.lengths
        gpu = "no GPU (memory not checked)"
        if self.cpu_bytes is not None:
            gpu = (
                f"a CPU, memory budget {self.cpu_bytes / GiB:.1f} GiB ({self.cpu_source}; "
                f"plan budget {self.budget / GiB:.1f} GiB)"
            )
        if self.gpu_bytes is not None:
            gpu = f"a GPU with {self.gpu_bytes / GiB:.1f} GiB free (plan budget {self.budget / GiB:.1f} GiB)"
        rows = f"generation reads {self.generation_rows} rows at once"
        if self.generation_rows < self.generation_rows_needed:
            rows += (
                f" (of {self.generation_rows_needed} in flight: generate calls read them in batches of that size, "
                "and a dev evaluation plays that many negotiations at a time)"
            )
        vllm = ""
        if self.vllm_gpu_memory_utilization is not None:
            vllm = f"; vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization:.2f}"
        budget = f"{self.time_budget_min} min" if self.time_budget_min else "none (runs to --steps)"
        lines = [
            f"preflight: {self.model} ({f.model_class}, {_count(f.total)} parameters, "
            f"{_count(f.text)} in the text model) on {gpu}",
            f"  episodes: {lg.source}; tokens after the prompt {lg.episode}; prompt {lg.prompt}; "
            f"seller turns {lg.turns}",
            f"  max_tokens {self.max_tokens}: {self.max_tokens_why}; sequences up to {self.seq_len} tokens",
            f"  finetune {self.finetune} ({_count(self.trainable)} trainable parameters): {self.finetune_why}",
            f"  batch: {self.sequences} sequences per step = micro-batch {self.micro_batch} x {self.grad_accum} "
            f"accumulation steps (per_device_train_batch_size={self.micro_batch}, "
            f"gradient_accumulation_steps={self.grad_accum}); {rows}{vllm}",
            f"  memory: {self.memory.describe()}",
            f"  time budget: {budget}",
        ]
        return "\n".join(lines)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def usable_bytes(gpu_bytes: int | None) -> int | None:
    return None if gpu_bytes is None else int(gpu_bytes * USABLE) - CUDA_OVERHEAD


def plan_budget(gpu_bytes: int | None, cpu_bytes: int | None) -> int | None:
    """What a plan may fill: the GPU's usable bytes, else the CPU budget less :data:`CPU_OVERHEAD`, else None (no
    check)."""
    if gpu_bytes is not None:
        return usable_bytes(gpu_bytes)
    return None if cpu_bytes is None else cpu_bytes - CPU_OVERHEAD


def cpu_budget(cfg: TrainConfig) -> tuple[int, str]:
    """(bytes, where from) of a CPU run's memory budget: ``--memory-gb``, else :data:`CPU_AVAILABLE_SHARE` of the
    RAM available now."""
    if cfg.memory_gb:
        return int(cfg.memory_gb * GiB), f"--memory-gb {cfg.memory_gb:g}"
    import psutil

    available = psutil.virtual_memory().available
    return int(available * CPU_AVAILABLE_SHARE), f"{CPU_AVAILABLE_SHARE:.0%} of the {available / GiB:.1f} GiB available"


def visible_gpu_bytes() -> int | None:
    """Free memory of the current CUDA device, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, _total = torch.cuda.mem_get_info()
    return int(free)


def model_config(cfg: TrainConfig) -> Any:
    """The config of the model to train, without downloading weights: the published shape for a size alias, the
    checkpoint's own ``config.json`` for ``hf:PATH``."""
    if cfg.model in GEMMA_SIZES:
        from .gemma4_shapes import build_config

        return build_config(cfg.model)
    from transformers import AutoConfig

    from .hf_model import model_source

    source = model_source(cfg)
    try:
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model: cannot read the config of {source!r}: {e}") from None


def episode_cap(lengths: EpisodeLengths, margin: float = MARGIN) -> int:
    return int(math.ceil(lengths.episode.p99 * (1 + margin) / CAP_STEP) * CAP_STEP)


def preflight(
    cfg: TrainConfig,
    tokenizer: Any,
    *,
    given: Collection[str] = (),
    gpu_bytes: int | None = None,
    episodes: int = 64,
) -> TrainPlan:
    """Measure and plan for this machine (``gpu_bytes`` defaults to the free memory of the visible GPU; without a
    GPU, the plan fills the CPU budget of :func:`cpu_budget`)."""
    lengths = measure_episode_lengths(
        tokenizer,
        n=episodes,
        max_rounds=cfg.max_rounds,
        buyers=cfg.train_buyers,
        sellers=cfg.sft_sellers,
        template=cfg.template_name,
    )
    if gpu_bytes is None:
        gpu_bytes = visible_gpu_bytes()
    cpu_bytes, cpu_source = cpu_budget(cfg) if gpu_bytes is None else (None, "")
    return plan(
        cfg,
        gpu_bytes,
        facts=model_facts(model_config(cfg)),
        lengths=lengths,
        given=given,
        cpu_bytes=cpu_bytes,
        cpu_source=cpu_source,
    )


def plan(
    cfg: TrainConfig,
    gpu_bytes: int | None,
    *,
    facts: ModelFacts,
    lengths: EpisodeLengths,
    given: Collection[str] = (),
    cpu_bytes: int | None = None,
    cpu_source: str = "",
) -> TrainPlan:
    """The run's plan, or :class:`PreflightError` naming the flag to change; ``given`` names the TrainConfig
    fields the user set (the others are the plan's to choose). Without a GPU, ``cpu_bytes`` is the CPU's memory
    budget (None: memory is not checked)."""
    if cfg.model in GEMMA_SIZES and gpu_bytes is None:
        raise PreflightError(
            f"model {cfg.model!r} ({GEMMA_SIZES[cfg.model]}) needs a CUDA GPU and none is visible; on a CPU, "
            "train the built-in tiny seller (--model tiny) or a small local chat checkpoint (--model hf:PATH)"
        )
    max_tokens, max_tokens_why = _episode_cap(cfg, lengths, given)
    seq_len = lengths.prompt.max + max_tokens
    sequences = cfg.scenarios_per_step * cfg.group_size
    vllm_colocated = cfg.use_vllm and not cfg.vllm_server
    dev_rows = cfg.dev_scenarios * len(DEV_BUYERS)  # a dev evaluation plays every dev scenario against every dev buyer
    rows_needed = dev_rows if cfg.use_vllm else max(sequences, dev_rows)
    if "generation_rows" in given:
        rows_needed = cfg.generation_rows
    on_cpu = gpu_bytes is None
    budget = plan_budget(gpu_bytes, cpu_bytes)
    reserved, utilization = 0, None
    if vllm_colocated and gpu_bytes is not None:
        utilization = _vllm_utilization(facts, sequences, seq_len, gpu_bytes)
        reserved = int(utilization * gpu_bytes)
    mode, why = _finetune(cfg, facts, reserved, budget, on_cpu, given)
    rows = [rows_needed] if "generation_rows" in given else _halvings(rows_needed)
    layout = _layout(facts, mode, cfg.lora_rank, sequences, seq_len, rows, reserved, budget, on_cpu)
    if layout is None:
        if on_cpu:
            raise PreflightError(_cpu_refusal(cfg, facts, mode, seq_len, budget or 0, cpu_bytes or 0, cpu_source))
        raise PreflightError(_refusal(cfg, facts, seq_len, reserved, gpu_bytes, given))
    return TrainPlan(
        model=cfg.model,
        facts=facts,
        lengths=lengths,
        finetune=mode,
        finetune_why=why,
        lora_rank=cfg.lora_rank,
        max_tokens=max_tokens,
        max_tokens_why=max_tokens_why,
        seq_len=seq_len,
        sequences=sequences,
        micro_batch=layout.micro_batch,
        grad_accum=sequences // layout.micro_batch,
        generation_rows=layout.rows,
        generation_rows_needed=rows_needed,
        vllm_gpu_memory_utilization=utilization,
        time_budget_min=cfg.time_budget_min if "time_budget_min" in given else 0.0,
        gpu_bytes=gpu_bytes,
        memory=layout.memory,
        cpu_bytes=cpu_bytes if on_cpu else None,
        cpu_source=cpu_source,
    )


def _finetune(
    cfg: TrainConfig, facts: ModelFacts, reserved: int, budget: int | None, on_cpu: bool, given: Collection[str]
) -> tuple[str, str]:
    """(mode, why): as given, else full when its states take at most FULL_STATE_SHARE of the budget."""
    if "finetune" in given:
        return cfg.finetune, "given (--finetune)"
    weights, gradients, optimizer = state_bytes(facts, "full", 0, on_cpu=on_cpu)
    states = weights + gradients + optimizer + reserved
    if budget is None:
        return "full", "no GPU to plan for (a small model on a CPU trains fully; --finetune lora to choose LoRA)"
    if states <= FULL_STATE_SHARE * budget:
        return "full", f"full fine-tuning's states ({states / GiB:.1f} GiB) leave room for activations and rollouts"
    return "lora", (
        f"full fine-tuning's weights, gradients and AdamW states alone take {states / GiB:.1f} GiB "
        f"(more than {FULL_STATE_SHARE:.0%} of the {budget / GiB:.1f} GiB budget)"
    )


def _episode_cap(cfg: TrainConfig, lengths: EpisodeLengths, given: Collection[str]) -> tuple[int, str]:
    p99 = lengths.episode.p99
    if "max_tokens" not in given:
        return episode_cap(lengths), f"measured p99 {p99} + {MARGIN:.0%} margin"
    if cfg.max_tokens < p99:
        raise PreflightError(
            f"max_tokens {cfg.max_tokens} is below the measured 99th percentile of episode length ({p99} tokens "
            f"after the prompt at {cfg.max_rounds} rounds; {lengths.source}): an episode over the cap stops "
            f"training. Raise --max-tokens to {episode_cap(lengths)} (or leave it out to have it measured), or "
            "lower --max-rounds"
        )
    return cfg.max_tokens, "given (--max-tokens)"


@dataclass(frozen=True, slots=True)
class Layout:
    micro_batch: int
    rows: int
    memory: MemoryEstimate


def _halvings(rows: int) -> list[int]:
    """``rows``, then halved until one: the generation row counts a plan tries, largest first."""
    out = [rows]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return out


def _layout(
    facts: ModelFacts,
    mode: str,
    rank: int,
    sequences: int,
    seq_len: int,
    rows: list[int],
    reserved: int,
    budget: int | None,
    on_cpu: bool,
) -> Layout | None:
    """The largest micro-batch (a divisor of ``sequences``) and generation row count (of ``rows``, largest first)
    that fit, or None."""
    batches = [b for b in range(min(MAX_MICRO_BATCH, sequences), 0, -1) if sequences % b == 0]

    def mem(b: int, r: int) -> MemoryEstimate:
        return estimate(
            facts,
            mode,
            rank,
            micro_batch=b,
            seq_len=seq_len,
            generation_rows=r,
            vllm_reserved=reserved,
            on_cpu=on_cpu,
        )

    if budget is None:
        return Layout(batches[0], rows[0], mem(batches[0], rows[0]))
    b = next((b for b in batches if mem(b, 1).training <= budget), None)
    r = next((r for r in rows if mem(1, r).rollouts <= budget), None)
    if b is None or r is None:
        return None
    return Layout(b, r, mem(b, r))


def _vllm_utilization(facts: ModelFacts, rows: int, seq_len: int, gpu_bytes: int) -> float:
    """The share of the GPU a colocated vLLM engine needs for its own bf16 weights and the step's cache (at least
    TRL's default), rounded up to 0.05."""
    need = 2 * facts.total + kv_cache_bytes(facts, rows, seq_len) + CUDA_OVERHEAD
    return max(TRL_VLLM_UTILIZATION, math.ceil(need / gpu_bytes / 0.05) * 0.05)


def _refusal(
    cfg: TrainConfig, facts: ModelFacts, seq_len: int, reserved: int, gpu_bytes: int | None, given: Collection[str]
) -> str:
    budget = usable_bytes(gpu_bytes) or 0
    free = (gpu_bytes or 0) / GiB
    where = f"{cfg.model} does not fit a GPU with {free:.1f} GiB free (plan budget {budget / GiB:.1f} GiB)"
    lora = estimate(
        facts, "lora", cfg.lora_rank, micro_batch=1, seq_len=seq_len, generation_rows=1, vllm_reserved=reserved
    )
    if cfg.finetune == "full" and "finetune" in given:
        full = estimate(facts, "full", 0, micro_batch=1, seq_len=seq_len, generation_rows=1, vllm_reserved=reserved)
        why = f"{where}: full fine-tuning needs at least {full.peak / GiB:.1f} GiB ({full.describe()})"
        if lora.peak <= budget:
            return f"{why}; use --finetune lora"
        return f"{why}; with --finetune lora{_lora_refusal(cfg, lora, seq_len, budget)}"
    return where + _lora_refusal(cfg, lora, seq_len, budget)


def _cpu_refusal(
    cfg: TrainConfig, facts: ModelFacts, mode: str, seq_len: int, budget: int, cpu_bytes: int, source: str
) -> str:
    least = estimate(facts, mode, cfg.lora_rank, micro_batch=1, seq_len=seq_len, generation_rows=1, on_cpu=True)
    return (
        f"{cfg.model} does not fit this CPU's memory budget of {cpu_bytes / GiB:.1f} GiB ({source}; plan budget "
        f"{budget / GiB:.1f} GiB): one sequence of {seq_len} tokens at a time needs {least.peak / GiB:.1f} GiB "
        f"with --finetune {mode} ({least.describe()}); raise --memory-gb or shorten episodes with --max-rounds "
        f"(now {cfg.max_rounds})" + ("" if mode == "lora" else ", or use --finetune lora")
    )


def _lora_refusal(cfg: TrainConfig, lora: MemoryEstimate, seq_len: int, budget: int) -> str:
    states = lora.weights + lora.optimizer + lora.reserved
    if states > budget:
        sizes = list(GEMMA_SIZES)
        smaller = sizes[: sizes.index(cfg.model)] if cfg.model in sizes else []
        alt = f" or a smaller --model ({', '.join(smaller)})" if smaller else ""
        return f": its weights alone need {states / GiB:.1f} GiB even with LoRA; use a larger GPU{alt}"
    return (
        f": even one sequence of {seq_len} tokens at a time needs {lora.peak / GiB:.1f} GiB with LoRA "
        f"({lora.describe()}); shorten episodes with --max-rounds (now {cfg.max_rounds}) or use a larger GPU"
    )
