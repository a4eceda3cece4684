"""The tiny compact policy: a few-million-parameter model built from scratch, behaviour-cloned on rule sellers, played
through the compact word protocol (:mod:`nego.agents.compact.protocol`) on a CPU."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .policy_kind import Echo, Start

if TYPE_CHECKING:
    from nego.agents.compact.protocol import CompactFactory

    from .config import TrainConfig
    from .runner import EpisodeRunner

TINY = "tiny"
TINY_MAX_TOKENS = 512
"""The tiny model's episode cap: compact episodes of 10 rounds run under 200 words."""
TINY_DEFAULT_LR = 1e-4  # dev-split arms, judged sampled: bench/results/tiny_dev_sweep.txt
TINY_DEFAULT_TEMPERATURE = 0.7  # dev-split arm D against arm C's T = 1: bench/results/tiny_robust_eval.txt
TINY_SFT_EPISODES, TINY_SFT_STEPS, TINY_SFT_LR, TINY_SFT_BATCH = 3000, 300, 2e-3, 32
"""The tiny model's warm start: episodes imitated, optimizer steps, learning rate and batch."""


@dataclass(slots=True)
class CompactRollout:
    """The tiny policy in a rollout: negotiators of the model as it is at this step, at the trainer's temperature."""

    tokenizer: Any

    def factory(self, spec: str, model: Any, trainer: Any) -> CompactFactory:
        from nego.agents.compact.protocol import CompactFactory, CompactPolicy

        return CompactFactory(spec, CompactPolicy(model, self.tokenizer), float(trainer.temperature))

    def finish(self) -> None:
        pass


class TinyKind:
    """The built-in tiny seller: warm start, then GRPO on the compact protocol."""

    name = TINY
    describe = TINY
    registry_format = "compact"
    default_lr = TINY_DEFAULT_LR
    default_temperature = TINY_DEFAULT_TEMPERATURE
    learner_max_tokens = TINY_MAX_TOKENS
    gradient_checkpointing = False
    plays_league = True

    def accepts(self, model: str) -> bool:
        return model == TINY

    def config_model(self, path: str) -> str:
        return TINY

    def check(self, cfg: TrainConfig) -> None:
        from .config import ConfigError

        if cfg.finetune == "lora":
            raise ConfigError("finetune: the tiny model trains fully (lora is for real models)")
        if cfg.sft_repairs:
            raise ConfigError("sft_repairs: repair examples are for the warm start of chat models")

    def resolve(self, cfg: TrainConfig) -> TrainConfig:
        """The tiny model is not planned: it trains on a CPU, fully, with its own episode cap and warm start."""
        finetune = "full" if cfg.finetune == "auto" else cfg.finetune
        return replace(
            cfg,
            finetune=finetune,
            max_tokens=cfg.max_tokens or TINY_MAX_TOKENS,
            sft_episodes=cfg.sft_episodes or TINY_SFT_EPISODES,
            sft_steps=TINY_SFT_STEPS if cfg.sft_steps < 0 else cfg.sft_steps,
            sft_lr=cfg.sft_lr or TINY_SFT_LR,
            sft_batch=cfg.sft_batch or TINY_SFT_BATCH,
        )

    def default_template(self, model: str) -> str:
        return ""  # the compact word protocol has no conversation template

    def start(self, cfg: TrainConfig, run_dir: Path, runner: EpisodeRunner, echo: Echo, started: float) -> Start:
        from .checkpoints import save_run_config

        save_run_config(run_dir, cfg)
        model, tok = warm_start(cfg, run_dir, echo, started, runner)
        return Start(cfg, model, tok, str((run_dir / "base").resolve()), cfg.sft_steps)

    def factory(self, model: Any, tokenizer: Any, cfg: TrainConfig, spec: str) -> CompactFactory:
        from nego.agents.compact.protocol import CompactFactory, CompactPolicy

        return CompactFactory(spec, CompactPolicy(model, tokenizer), cfg.sampling_temperature)

    def rollout_policy(self, tokenizer: Any, cfg: TrainConfig) -> CompactRollout:
        return CompactRollout(tokenizer)

    def registry_config(self, cfg: TrainConfig) -> dict[str, Any]:
        return {}

    def load(self, path: str) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

        return AutoModelForCausalLM.from_pretrained(path), PreTrainedTokenizerFast.from_pretrained(path)


TINY_KIND = TinyKind()


def warm_start(
    cfg: TrainConfig, run_dir: Path, echo: Echo, started: float, runner: EpisodeRunner | None = None
) -> tuple[Any, Any]:
    """The tiny base model: loaded from ``run_dir/base`` if it exists, else built and behaviour-cloned there (the
    rule-seller transcripts it imitates are written through ``runner``'s transcripts, as the warm-start arm)."""
    from .checkpoints import CUT_SHORT
    from .pool import BuyerPool
    from .rollout import split_scenarios
    from .sft import clone_for_run, record_transcripts
    from .tiny_model import build_tiny_model, parameter_count
    from .tokenizer import build_tokenizer

    base = run_dir / "base"
    if (base / "config.json").exists():
        echo(f"warm start: reusing {base}")
        return TINY_KIND.load(str(base))
    aims = cfg.offer_words == "aim"
    tok = build_tokenizer(aims)
    model = build_tiny_model(tok, seed=cfg.seed)
    echo(f"tiny model: {parameter_count(model) / 1e6:.2f}M parameters, vocabulary {len(tok)}")
    scenarios = split_scenarios("train", cfg.train_scenarios, cfg.max_rounds)
    t0 = time.perf_counter()
    writer = runner.market.writer if runner is not None else None
    traces = record_transcripts(
        scenarios,
        cfg.sft_episodes,
        cfg.sft_sellers,
        BuyerPool(tuple(cfg.train_buyers)).rules(),
        cfg.seed,
        writer,
        cfg.sft_pick,
        aims,
    )
    echo(f"warm start: {len(traces)} rule-seller transcripts in {time.perf_counter() - t0:.1f}s")
    if cfg.sft_steps:
        clone_for_run(model, tok, traces, cfg, started, echo, base / CUT_SHORT)
    model.save_pretrained(base)
    tok.save_pretrained(base)
    return model, tok
