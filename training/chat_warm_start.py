"""The warm start of a chat model: rule sellers play the training split, each seller's side is rendered in exactly
the conversation the model is played on, with the rule's moves as the model's replies, and the model learns to write
those replies (behaviour cloning on the reply ids only; the prompts and updates are context).

The rendering is the chat rollout's own (:func:`~.episode_lengths.render_episode`: the conversation template through
the model's chat template, each reply recorded by a :class:`~.chat_rollout.ChatTrace`), so the ids a warm-started
model is trained on are the prompt it receives at each turn followed by the reply it should write. Full fine-tuning,
or LoRA adapters merged into the weights afterwards (``finetune = lora``), so that what is saved is a plain model.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from nego.agents.llm.prompts import load_template
from nego.market.marketplace import Played

from .checkpoints import CUT_SHORT
from .episode_lengths import render_episode
from .policy_kind import Echo
from .repairs import with_repairs
from .sft import Example, clone_for_run

if TYPE_CHECKING:
    from .config import TrainConfig
    from .runner import EpisodeRunner


PASS_TOKENS = 2048
"""The padded tokens one forward and backward pass of the warm start reads at most: a batch of long episodes is read
a row or two at a time (the same step), so the activations held stay bounded, while a pass stays long enough for the
matrix kernels. SmolLM2's default warm start (batches of 4 episodes of about 1,060 tokens) peaks at 6.3 GiB with it
and 9.4 GiB without (ad hoc, 10 and 30 steps on 2 cores)."""


@dataclass(frozen=True, slots=True)
class ChatWarmStart:
    """A warm-started chat model: the model, where it was saved and how many optimizer steps it took."""

    model: Any
    path: Path
    steps: int


def chat_examples(
    tokenizer: Any, played: Sequence[Played], template: str, *, repairs: float = 0.0, seed: int = 0
) -> list[Example]:
    """Each played rule-seller negotiation as the seller's chat episode: prompt and updates as context (mask 0), the
    rule's replies in the template's reply format as the ids to learn (mask 1, as the template writes them).
    ``repairs``: the share of offers first shown as an invalid reply and its feedback (:func:`.repairs.with_repairs`,
    drawn from ``seed``)."""
    tmpl = load_template(template)
    rng = np.random.default_rng([seed, 7])
    out = []
    for p in played:
        result = p.result
        if repairs:
            result = with_repairs(p.job.scenario, result, repairs, rng, prompt_id=tmpl.id, line=tmpl.line_replies)
        episode = render_episode(tokenizer, p.job.scenario, result, template=template)
        out.append(Example(episode.prompt + episode.ids, [0] * len(episode.prompt) + episode.mask))
    return out


def chat_warm_start(
    cfg: TrainConfig, model: Any, tokenizer: Any, run_dir: Path, runner: EpisodeRunner, echo: Echo, started: float
) -> ChatWarmStart:
    """``model`` behaviour-cloned on ``cfg.sft_episodes`` rule-seller episodes and saved in ``run_dir/base``; a base
    an earlier attempt of the run saved is loaded instead."""
    from .pool import BuyerPool
    from .rollout import split_scenarios
    from .sft import play_warm_start

    base = run_dir / "base"
    if (base / "config.json").exists():
        echo(f"warm start: reusing {base}")
        from transformers import AutoModelForCausalLM

        cut = (base / CUT_SHORT).read_text().split("/")[0] if (base / CUT_SHORT).exists() else cfg.sft_steps
        return ChatWarmStart(AutoModelForCausalLM.from_pretrained(base, dtype=model.dtype), base, int(cut))
    scenarios = split_scenarios("train", cfg.train_scenarios, cfg.max_rounds)
    t0 = time.perf_counter()
    played = play_warm_start(
        scenarios,
        cfg.sft_episodes,
        cfg.sft_sellers,
        BuyerPool(tuple(cfg.train_buyers)).rules(),
        cfg.seed,
        runner.market.writer,
        cfg.sft_pick,
        record=False,
    )
    examples = chat_examples(tokenizer, played, cfg.template_name, repairs=cfg.sft_repairs, seed=cfg.seed)
    tokens = sum(len(e.ids) for e in examples)
    repaired = f", {cfg.sft_repairs:.0%} of offers first written invalid and repaired" if cfg.sft_repairs else ""
    echo(
        f"warm start: {len(examples)} rule-seller episodes ({tokens / len(examples):.0f} tokens each on average"
        f"{repaired}) in {time.perf_counter() - t0:.1f}s"
    )
    trained = _with_adapters(model, cfg) if cfg.finetune == "lora" else model
    partial = run_dir / "base.partial"  # renamed into place once whole: a killed save leaves no base to reuse
    shutil.rmtree(partial, ignore_errors=True)
    r = clone_for_run(
        trained, tokenizer, examples, cfg, started, echo, partial / CUT_SHORT, echo_every=10, pass_tokens=PASS_TOKENS
    )
    model = trained.merge_and_unload() if cfg.finetune == "lora" else trained
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    os.replace(partial, base)
    return ChatWarmStart(model, base, r.steps)


def _with_adapters(model: Any, cfg: TrainConfig) -> Any:
    from peft import get_peft_model

    from .trainer import lora_config

    return get_peft_model(model, lora_config(cfg.lora_rank))
