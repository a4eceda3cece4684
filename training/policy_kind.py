"""The kinds of seller policy nego trains, chosen once from the config and asked everywhere else.

A kind supplies everything that differs between the tiny compact model and a chat model: how the starting model is
made or loaded (a warm start, or a preflight plan and a checkpoint), the negotiators that play it, the adapter that
turns it into a rollout policy, the registry format and the defaults of its auto fields. ``nego train``, the
in-market learner, the preflight and dev evaluation ask the kind; none of them asks which kind it is. A new kind is
one class that satisfies :class:`PolicyKind`, listed in :data:`KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nego.agents.registry import NegotiatorFactory

    from .config import TrainConfig
    from .runner import EpisodeRunner

Echo = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Start:
    """The model a run starts from, with what the registry and the trainer need to know about it."""

    cfg: TrainConfig
    """The run's config with every auto field decided (the kind's defaults, or the preflight's plan)."""
    model: Any
    tokenizer: Any
    source: str
    """Where the registered base model lives (a path or a hub id)."""
    warm_start_steps: int
    trl_overrides: dict[str, Any] = field(default_factory=dict)
    """GRPOConfig fields a plan decided (micro-batches, gradient accumulation)."""


class RolloutPolicy(Protocol):
    """The current policy as a market rollout plays it: negotiators for one batch, and what to do once it ends."""

    def factory(self, spec: str, model: Any, trainer: Any) -> NegotiatorFactory: ...

    def finish(self) -> None: ...


class PolicyKind(Protocol):
    """What one kind of seller policy supplies to training, dev evaluation and the in-market learner."""

    name: str
    describe: str
    """How a config names models of this kind (for error messages)."""
    registry_format: str
    """The model registry's ``format`` of models of this kind (how ``--sellers NAME`` plays them)."""
    default_lr: float
    default_temperature: float
    learner_max_tokens: int
    """The in-market learner's episode cap when none is given."""
    gradient_checkpointing: bool
    plays_league: bool
    """Whether league (self-play) buyers can be played by a policy of this kind."""

    def accepts(self, model: str) -> bool:
        """Whether a config's ``model`` names a model of this kind."""
        ...

    def config_model(self, path: str) -> str:
        """The ``model`` a config names a saved model of this kind at ``path`` by."""
        ...

    def check(self, cfg: TrainConfig) -> None:
        """Raise ConfigError for settings this kind cannot train with."""
        ...

    def resolve(self, cfg: TrainConfig) -> TrainConfig:
        """``cfg`` with the auto fields this kind decides without a plan (the warm start's among them)."""
        ...

    def default_template(self, model: str) -> str:
        """The conversation template a model of this kind is trained on when the config names none."""
        ...

    def start(self, cfg: TrainConfig, run_dir: Path, runner: EpisodeRunner, echo: Echo, started: float) -> Start:
        """The starting model of a run in ``run_dir`` (made, or reused from an earlier attempt), its config saved."""
        ...

    def factory(self, model: Any, tokenizer: Any, cfg: TrainConfig, spec: str) -> NegotiatorFactory:
        """Negotiators of ``model`` as it is now, under ``spec``, sampling at the run's temperature."""
        ...

    def rollout_policy(self, tokenizer: Any, cfg: TrainConfig) -> RolloutPolicy: ...

    def registry_config(self, cfg: TrainConfig) -> dict[str, Any]:
        """What the registry must record, beyond the run's config, to play a model of this kind as it was trained."""
        ...

    def load(self, path: str) -> tuple[Any, Any]:
        """A saved model of this kind and its tokenizer."""
        ...


def kinds() -> tuple[PolicyKind, ...]:
    """Every kind; the first that accepts a config's model name is its kind."""
    from .chat_kind import CHAT
    from .tiny_kind import TINY_KIND

    return (TINY_KIND, CHAT)


def policy_kind(model: str) -> PolicyKind:
    """The kind of the ``model`` a config names; ConfigError for a name no kind accepts."""
    from .config import ConfigError

    for kind in kinds():
        if kind.accepts(model):
            return kind
    raise ConfigError(f"model: {model!r} is not one of {', '.join(k.describe for k in kinds())}")


def kind_of_format(registry_format: str) -> PolicyKind:
    """The kind of a registered model, from its registry ``format``."""
    for kind in kinds():
        if kind.registry_format == registry_format:
            return kind
    raise ValueError(f"no policy kind trains models of format {registry_format!r}")
