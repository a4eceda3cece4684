"""Chat models (Gemma 4 sizes, any local Hugging Face checkpoint): planned by the preflight before their weights load,
played and trained on the conversation layout they are served with (:mod:`.chat_rollout`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import GEMMA_SIZES
from .policy_kind import Echo, Start

if TYPE_CHECKING:
    from .chat_rollout import ChatFactory, ChatRollout
    from .config import TrainConfig
    from .runner import EpisodeRunner

REAL_DEFAULT_LR = 1e-6
REAL_DEFAULT_TEMPERATURE = 1.0
CHAT_LEARNER_MAX_TOKENS = 4096
"""The in-market learner's episode cap for chat models: generous, since each turn is capped on its own."""


class ChatKind:
    """A real chat model: preflight plan, checkpoint load, GRPO on its own chat template."""

    name = "chat"
    describe = f"{', '.join(GEMMA_SIZES)} or hf:PATH"
    registry_format = "hf"
    default_lr = REAL_DEFAULT_LR
    default_temperature = REAL_DEFAULT_TEMPERATURE
    learner_max_tokens = CHAT_LEARNER_MAX_TOKENS
    gradient_checkpointing = True
    plays_league = False

    def accepts(self, model: str) -> bool:
        return model in GEMMA_SIZES or model.startswith("hf:")

    def config_model(self, path: str) -> str:
        return f"hf:{path}"

    def check(self, cfg: TrainConfig) -> None:
        pass

    def resolve(self, cfg: TrainConfig) -> TrainConfig:
        return cfg  # the auto fields are the preflight's to decide, once the tokenizer is loaded

    def start(self, cfg: TrainConfig, run_dir: Path, runner: EpisodeRunner, echo: Echo, started: float) -> Start:
        """Tokenizer first, then the preflight's plan (which refuses what cannot fit), then the weights."""
        from .checkpoints import save_run_config
        from .hf_model import load_chat_tokenizer, load_chat_weights, model_source
        from .preflight import preflight

        tok = load_chat_tokenizer(cfg)
        plan = preflight(cfg, tok, given=cfg.given)
        echo(plan.describe())
        cfg = plan.apply(cfg)
        model = load_chat_weights(cfg)
        save_run_config(run_dir, cfg)
        return Start(cfg, model, tok, model_source(cfg), 0, plan.grpo_overrides(), plan.generation_rows)

    def factory(self, model: Any, tokenizer: Any, cfg: TrainConfig, spec: str) -> ChatFactory:
        from .chat_rollout import ChatFactory, ChatPolicy

        return ChatFactory(spec, ChatPolicy(model, tokenizer, max_new=cfg.turn_tokens), cfg.sampling_temperature)

    def rollout_policy(self, tokenizer: Any, cfg: TrainConfig, generation_rows: int | None) -> ChatRollout:
        from .chat_rollout import DEFAULT_GENERATION_ROWS, ChatRollout

        rows = DEFAULT_GENERATION_ROWS if generation_rows is None else generation_rows
        return ChatRollout(tokenizer, max_new=cfg.turn_tokens, max_rows=rows)

    def registry_config(self, cfg: TrainConfig) -> dict[str, Any]:
        from .chat_rollout import layout_config

        return layout_config(cfg.turn_tokens)

    def load(self, path: str) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return model, tokenizer


CHAT = ChatKind()
