"""Chat models (Gemma 4 sizes, SmolLM2, any local Hugging Face checkpoint): planned by the preflight before their
weights load, warm-started when the config asks (:mod:`.chat_warm_start`), played and trained on the conversation
layout they are served with (:mod:`.chat_rollout`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nego.agents.llm.chat_layout import CHAT_TEMPLATE
from nego.agents.model_specs import SMOLLM2

from .config import GEMMA_SIZES
from .free_memory import release_freed_memory
from .policy_kind import Echo, Start

if TYPE_CHECKING:
    from .chat_rollout import ChatFactory, ChatRollout
    from .config import TrainConfig
    from .runner import EpisodeRunner

REAL_DEFAULT_LR = 1e-6
REAL_DEFAULT_TEMPERATURE = 1.0
CHAT_LEARNER_MAX_TOKENS = 4096
"""The in-market learner's episode cap for chat models: generous, since each turn is capped on its own."""
SMALL_TEMPLATE = "negotiator-chat-small-v3"
"""The conversation template of small models: the same layout in about half the tokens, replies of one JSON line, and
invalid replies withheld from the rest of the conversation (chosen on the dev split,
``bench/results/smollm2_reply_ranges.txt``)."""
CHAT_SFT_EPISODES, CHAT_SFT_LR, CHAT_SFT_BATCH = 240, 5e-5, 4
SMOLLM2_SFT_STEPS = 30
"""SmolLM2's warm start: it writes prose until taught the reply format (other checkpoints get none by default)."""


class ChatKind:
    """A real chat model: preflight plan, checkpoint load, GRPO on its own chat template."""

    name = "chat"
    describe = f"{SMOLLM2}, {', '.join(GEMMA_SIZES)} or hf:PATH"
    registry_format = "hf"
    default_lr = REAL_DEFAULT_LR
    default_temperature = REAL_DEFAULT_TEMPERATURE
    learner_max_tokens = CHAT_LEARNER_MAX_TOKENS
    gradient_checkpointing = True
    plays_league = False

    def accepts(self, model: str) -> bool:
        return model in GEMMA_SIZES or model == SMOLLM2 or model.startswith("hf:")

    def config_model(self, path: str) -> str:
        return f"hf:{path}"

    def check(self, cfg: TrainConfig) -> None:
        from .config import ConfigError

        if cfg.offer_words != "levels":
            raise ConfigError("offer_words: a chat model writes its offers in its reply format (aim is for tiny)")

    def resolve(self, cfg: TrainConfig) -> TrainConfig:
        """The warm start's auto fields; the others are the preflight's to decide, once the tokenizer is loaded."""
        steps = (SMOLLM2_SFT_STEPS if cfg.model == SMOLLM2 else 0) if cfg.sft_steps < 0 else cfg.sft_steps
        return replace(
            cfg,
            sft_episodes=cfg.sft_episodes or CHAT_SFT_EPISODES,
            sft_steps=steps,
            sft_lr=cfg.sft_lr or CHAT_SFT_LR,
            sft_batch=cfg.sft_batch or CHAT_SFT_BATCH,
        )

    def default_template(self, model: str) -> str:
        return SMALL_TEMPLATE if model == SMOLLM2 else CHAT_TEMPLATE

    def start(self, cfg: TrainConfig, run_dir: Path, runner: EpisodeRunner, echo: Echo, started: float) -> Start:
        """Tokenizer first, then the preflight's plan (which refuses what cannot fit), then the weights, then the
        warm start if the config asks for one (the registered base is then the warm-started model)."""
        from .checkpoints import save_run_config
        from .hf_model import load_chat_tokenizer, load_chat_weights, model_source
        from .preflight import preflight

        tok = load_chat_tokenizer(cfg)
        plan = preflight(cfg, tok, given=cfg.given)
        echo(plan.describe())
        cfg = plan.apply(cfg)
        model = load_chat_weights(cfg)
        save_run_config(run_dir, cfg)
        source, steps = model_source(cfg), 0
        if cfg.sft_steps:
            from .chat_warm_start import chat_warm_start

            warm = chat_warm_start(cfg, model, tok, run_dir, runner, echo, started)
            model, source, steps = warm.model, str(warm.path.resolve()), warm.steps
            release_freed_memory()  # the warm start's optimizer states and activations
        return Start(cfg, model, tok, source, steps, plan.grpo_overrides())

    def factory(self, model: Any, tokenizer: Any, cfg: TrainConfig, spec: str) -> ChatFactory:
        from .chat_rollout import ChatFactory, ChatPolicy

        policy = ChatPolicy(
            model, tokenizer, max_new=cfg.turn_tokens, template=cfg.template_name, max_rows=generation_rows(cfg)
        )
        return ChatFactory(spec, policy, cfg.sampling_temperature)

    def rollout_policy(self, tokenizer: Any, cfg: TrainConfig) -> ChatRollout:
        from .chat_rollout import ChatRollout

        rows = generation_rows(cfg)
        return ChatRollout(tokenizer, max_new=cfg.turn_tokens, max_rows=rows, template=cfg.template_name)

    def registry_config(self, cfg: TrainConfig) -> dict[str, Any]:
        from .chat_rollout import layout_config

        return layout_config(cfg.template_name, cfg.turn_tokens)

    def load(self, path: str) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return model, tokenizer


def generation_rows(cfg: TrainConfig) -> int:
    """Rows one in-process generate call reads: the config's (the preflight's plan, or as given), else the
    rollout's default."""
    from .chat_rollout import DEFAULT_GENERATION_ROWS

    return cfg.generation_rows or DEFAULT_GENERATION_ROWS


CHAT = ChatKind()
