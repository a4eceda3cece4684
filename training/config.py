"""TrainConfig: every knob of a training run, written once with its help text; TOML files and CLI options fill it.

Validation happens here, before anything heavy loads: an unknown field or an impossible value fails with a
message naming the field and the fix.
"""

from __future__ import annotations

import logging
import math
import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nego.agents.threads import THREADS_HELP

from .tiny_kind import TINY

if TYPE_CHECKING:
    from .policy_kind import PolicyKind

logger = logging.getLogger(__name__)

GEMMA_SIZES: dict[str, str] = {
    "2.3b": "google/gemma-4-E2B-it",
    "4.5b": "google/gemma-4-E4B-it",
    "12b": "google/gemma-4-12B-it",
    "31b": "google/gemma-4-31B-it",
}
LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo")
SFT_PICKS = ("mixture", "best")
OFFER_WORDS = ("levels", "aim")
"""How the tiny seller writes an offer (see :mod:`nego.agents.compact.protocol`)."""
"""How the warm start picks the rule-seller episodes it imitates (see :func:`nego.training.sft.record_transcripts`)."""
# A market of buyers that end negotiations in different ways, parameters drawn per negotiation: time-dependent
# buyers that may run out of patience at a round the seller cannot see or hold out above their reservation,
# tit-for-tat, and four families that make stalling cost the seller (a reciprocating buyer that hardens when the
# seller does not move, a buyer with a private outside option that leaves when the seller's trend will not reach it,
# a stochastic quitter whose hazard rises while the seller stalls, a buyer with a private deadline). None of them is
# a held-out family (agents.rules.heldout.HELD_OUT_FAMILIES): the validation below refuses those. An entry listed k
# times is drawn k times as often: the reciprocating buyer five times and the outside option twice, so that 9 of 12
# draws punish a stall (chosen on the dev split: with each entry once, GRPO learned to stall the reciprocating dev
# buyer into no deal; bench/results/tiny_robust_eval.txt, arms B and C).
DEFAULT_TRAIN_BUYERS = (
    "timedep:e=0.3..3,patience=0.4..1",
    "timedep:e=0.3..3,margin=0..0.15",
    "tft",
    *("reciprocal:r=0.5..1.5,harden=0..0.5",) * 5,
    *("outside:low=0.05..0.3,high=0.3..0.6,e=0.5..2",) * 2,
    "hazard:quit=0.15..0.5,expect=0.01..0.05,e=0.5..2",
    "deadline:early=0.3..0.6,e=1..3",
)

DEV_BUYERS = ("timedep:e=1", "tft", "timedep:e=1,patience=0.5", "reciprocal", "outside", "hazard", "deadline")
"""The buyers of the dev evaluations during training: each dev scenario is played against every one."""


class ConfigError(ValueError):
    """A training configuration that cannot work; the message names the field and what to do."""


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class TrainConfig:
    """One training run: SFT warm start (tiny model only) then GRPO against a pool of training buyers."""

    model: str = _f(
        TINY,
        "seller model: tiny (built from scratch), smollm2 (SmolLM2-135M-Instruct, packaged), 2.3b, 4.5b, 12b, 31b "
        "(Gemma 4) or hf:PATH",
    )
    name: str = _f("", "registry name of the result (registered as NAME and NAME-rl); default: derived from model")
    out: str = _f("", "where checkpoints, logs and final weights go; default: $NEGO_HOME/runs/NAME")
    lr: float = _f(0.0, "GRPO learning rate; 0 = default (1e-4 for tiny, from dev-split arms; 1e-6 otherwise)")
    group_size: int = _f(8, "negotiations per scenario in one GRPO group (G >= 2)")
    scenarios_per_step: int = _f(8, "scenarios per optimizer step; batch = scenarios_per_step * group_size")
    steps: int = _f(
        120,
        "GRPO optimizer steps: a fixed amount of work, so a run's result depends on its seed only (the default fits "
        "15 minutes on 2 idle CPU cores with the warm start: bench/results/tiny_robust_eval.txt)",
    )
    beta: float = _f(0.0, "KL penalty towards the starting policy (0 = no reference model)")
    loss_type: str = _f("dapo", f"GRPO loss variant: {', '.join(LOSS_TYPES)}")
    pack: bool = _f(
        True,
        "read the GRPO loss's log-probabilities in length buckets, each padded only to its own longest episode, "
        "instead of one matrix padded to the longest prompt plus the longest completion: the same loss and "
        "gradients to float rounding, fewer tokens computed (bench/results/grpo_packing.txt)",
    )
    temperature: float = _f(
        0.0,
        "sampling temperature of the rollouts and of both registered models when played; 0 = default (0.7 for tiny, "
        "chosen on the dev split; 1.0 otherwise)",
    )
    finetune: str = _f(
        "auto", "full, lora (LoRA adapters) or auto: full for tiny, chosen by the preflight for real models"
    )
    lora_rank: int = _f(16, "LoRA rank when finetune = lora")
    max_rounds: int = _f(10, "rounds per negotiation during training (each side moves once per round)")
    max_tokens: int = _f(
        0,
        "cap on one episode's tokens after the prompt (longer episodes are an error); 0 = auto: 512 for tiny, the "
        "measured 99th percentile plus a margin for real models (the preflight)",
    )
    turn_tokens: int = _f(96, "cap on the new tokens of one seller turn (chat models); max_tokens caps the episode")
    template: str = _f(
        "",
        "conversation template a chat model is trained and played on (a built-in name or a file); empty = "
        "negotiator-chat-small-v3 for smollm2 (about half the tokens, invalid replies withheld), negotiator-chat-v1 "
        "otherwise",
    )
    train_buyers: list[str] = field(
        default_factory=lambda: list(DEFAULT_TRAIN_BUYERS),
        metadata={
            "help": "training buyer specs; a..b draws a parameter uniformly per negotiation; league:every=N is the "
            "policy itself as it was at the last multiple of N steps, on the buyer side"
        },
    )
    train_scenarios: int = _f(4000, "generated training scenarios (train split)")
    dev_scenarios: int = _f(64, "generated dev scenarios for evaluation during training (dev split)")
    eval_every: int = _f(50, "evaluate on the dev split every K steps (0 = only at the end)")
    save_every: int = _f(100, "write a resumable checkpoint every K steps (0 = only at the end)")
    no_deal_reward: str = _f("reservation", "reward without a deal: 'reservation' or a number in [0, 1]")
    invalid_penalty: float = _f(0.1, "subtracted from the reward per invalid seller action")
    sft_episodes: int = _f(0, "rule-based episodes the warm start imitates; 0 = auto (3000 for tiny, 240 for chat)")
    sft_steps: int = _f(
        -1,
        "warm-start optimizer steps (0 = skip); -1 = auto: 300 for tiny, 30 for smollm2, 0 for other chat models "
        "(instruction checkpoints that already follow the reply format)",
    )
    sft_lr: float = _f(0.0, "warm-start learning rate; 0 = auto (2e-3 for tiny, 5e-5 for chat models)")
    sft_batch: int = _f(0, "warm-start batch size; 0 = auto (32 for tiny, 4 for chat models)")
    sft_sellers: list[str] = field(
        default_factory=lambda: ["timedep:e=0.2,step=0.05"],
        metadata={"help": "rule-based sellers imitated in the warm start (default: Boulware that never stalls)"},
    )
    sft_pick: str = _f(
        "mixture",
        "which rule-seller episodes the warm start imitates: 'mixture' (each episode by one of sft_sellers, drawn) "
        "or 'best' (every seller plays each episode; the one with the highest seller utility is kept)",
    )
    offer_words: str = _f(
        "levels",
        "how the tiny seller writes an offer: 'levels' (an own-value level per issue) or 'aim' (one word, the offer's "
        "own utility in steps of 0.01, played as the cheapest outcome reaching it, as the rule sellers offer)",
    )
    sft_repairs: float = _f(
        0.0,
        "share of the warm start's seller offers shown first as an invalid reply, with the protocol's feedback on "
        "it, before the valid one (chat models; the invalid reply is context, the correction is learned)",
    )
    memory_gb: float = _f(
        0.0,
        "memory a real model's run on a CPU may fill, in GiB: the preflight sizes the micro-batch and the generation "
        "rows to it; 0 = 80% of the available RAM (on a GPU the plan fills the GPU's free memory)",
    )
    generation_rows: int = _f(
        0,
        "rows one in-process generate call reads at once, and negotiations a dev evaluation plays at once (real "
        "models); 0 = auto: the preflight's memory plan",
    )
    seed: int = _f(0, "seed for model init, data order, buyer draws and sampling")
    threads: int = _f(0, THREADS_HELP)
    time_budget_min: float = _f(
        0.0,
        "optional time cap: stop early when the whole run reaches this many minutes (the warm start gets at most a "
        "third); a run it cuts short says so in its output and its registry entries; 0 = off",
    )
    use_vllm: bool = _f(False, "generate through vLLM via TRL (GPU, needs the vllm extra)")
    vllm_server: str = _f("", "URL of a `trl vllm-serve` server (server mode); empty = colocate")
    resume: str = _f("", "resume from this run directory (its latest checkpoint)")

    @property
    def kind(self) -> PolicyKind:
        """The policy kind of ``model``, which supplies everything that differs between kinds."""
        from .policy_kind import policy_kind

        return policy_kind(self.model)

    @property
    def given(self) -> frozenset[str]:
        """The fields a preflight must keep as set: the auto-able ones whose value is not the auto value."""
        out = {"max_tokens"} if self.max_tokens else set()
        if self.finetune != "auto":
            out.add("finetune")
        if self.time_budget_min:
            out.add("time_budget_min")
        if self.generation_rows:
            out.add("generation_rows")
        return frozenset(out)

    @property
    def template_name(self) -> str:
        """The conversation template of a chat model's run (the kind's choice when none is given)."""
        return self.template or self.kind.default_template(self.model)

    @property
    def learning_rate(self) -> float:
        return self.lr or self.kind.default_lr

    @property
    def sampling_temperature(self) -> float:
        return self.temperature or self.kind.default_temperature

    @property
    def run_name(self) -> str:
        if self.name:
            return self.name
        if self.model.startswith("hf:"):
            return Path(self.model[3:].rstrip("/")).name or "hf-model"
        if self.model == "smollm2":
            return "smollm2-bc"  # `smollm2` stays the model as shipped; this is the warm-started (cloned) one
        return self.model

    def validate(self) -> TrainConfig:
        """Return self, or raise :class:`ConfigError` naming the first impossible value."""
        kind = self.kind  # an unknown model fails here
        kind.check(self)
        checks = [
            (self.lr >= 0 and math.isfinite(self.lr), "lr must be a non-negative number (0 = default)"),
            (self.group_size >= 2, "group_size must be >= 2: GRPO compares negotiations within a group"),
            (self.scenarios_per_step >= 1, "scenarios_per_step must be >= 1"),
            (self.steps >= 1, "steps must be >= 1"),
            (self.beta >= 0, "beta must be >= 0"),
            (self.loss_type in LOSS_TYPES, f"loss_type must be one of {', '.join(LOSS_TYPES)}"),
            (self.temperature >= 0 and math.isfinite(self.temperature), "temperature must be >= 0 (0 = default)"),
            (self.finetune in ("auto", "full", "lora"), "finetune must be 'auto', 'full' or 'lora'"),
            (self.lora_rank >= 1, "lora_rank must be >= 1"),
            (1 <= self.max_rounds <= 30, "max_rounds must lie in 1..30"),
            (self.max_tokens == 0 or self.max_tokens >= 16, "max_tokens must be 0 (auto) or >= 16"),
            (self.turn_tokens >= 1, "turn_tokens must be >= 1"),
            (not self.max_tokens or self.turn_tokens <= self.max_tokens, "turn_tokens must not exceed max_tokens"),
            (bool(self.train_buyers), "train_buyers must name at least one buyer spec"),
            (self.train_scenarios >= self.scenarios_per_step, "train_scenarios must be >= scenarios_per_step"),
            (self.dev_scenarios >= 1, "dev_scenarios must be >= 1"),
            (self.eval_every >= 0 and self.save_every >= 0, "eval_every and save_every must be >= 0"),
            (self.invalid_penalty >= 0, "invalid_penalty must be >= 0"),
            (self.sft_steps >= -1 and self.sft_episodes >= 0, "sft_steps must be >= -1 and sft_episodes >= 0"),
            (self.sft_lr >= 0 and self.sft_batch >= 0, "sft_lr and sft_batch must be >= 0 (0 = auto)"),
            (bool(self.sft_sellers), "sft_sellers must name at least one rule-based seller"),
            (0 <= self.sft_repairs <= 1, "sft_repairs must be in [0, 1]"),
            (self.sft_pick in SFT_PICKS, f"sft_pick must be one of {', '.join(SFT_PICKS)}, got {self.sft_pick!r}"),
            (self.offer_words in OFFER_WORDS, f"offer_words must be one of {', '.join(OFFER_WORDS)}"),
            (self.threads >= 0 and self.time_budget_min >= 0, "threads and time_budget_min must be >= 0"),
            (self.memory_gb >= 0 and self.generation_rows >= 0, "memory_gb and generation_rows must be >= 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        no_deal_value(self.no_deal_reward)
        from .league import check_league
        from .pool import BuyerPool, refuse_held_out

        refuse_held_out("train_buyers", self.train_buyers)
        refuse_held_out("sft_sellers", self.sft_sellers)
        _resolve_all("sft_sellers", self.sft_sellers)
        check_league(self.train_buyers, kind.plays_league)
        BuyerPool(tuple(self.train_buyers)).check()
        return self


def _resolve_all(name: str, specs: list[str]) -> None:
    """Every spec resolves, so a typo fails before anything loads."""
    from nego.agents.registry import resolve

    for spec in specs:
        try:
            resolve(spec)
        except ValueError as e:
            raise ConfigError(f"{name}: {e}") from None


def no_deal_value(text: str) -> float | None:
    """None for 'reservation', else the fixed no-deal reward; raises ConfigError otherwise."""
    if text == "reservation":
        return None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"no_deal_reward must be 'reservation' or a number in [0, 1], got {text!r}")
    return v


def field_help() -> dict[str, str]:
    return {f.name: f.metadata["help"] for f in fields(TrainConfig)}


def field_default(name: str) -> Any:
    f = next(f for f in fields(TrainConfig) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default


def from_mapping(data: dict[str, Any], source: str = "config", base: TrainConfig | None = None) -> TrainConfig:
    """``base`` (defaults if None) updated with ``data``; unknown keys and wrong types fail naming ``source``."""
    known = {f.name: f for f in fields(TrainConfig)}
    data = _renamed(data, source)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {', '.join(unknown)}; known: {', '.join(known)}")
    clean: dict[str, Any] = {}
    for key, value in data.items():
        want = type(field_default(key))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if want is list and isinstance(value, list) and all(isinstance(v, str) for v in value):
            clean[key] = list(value)
            continue
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ConfigError(f"{source}: {key} must be {want.__name__}, got {value!r}")
        clean[key] = value
    return replace(base or TrainConfig(), **clean).validate()


RENAMED = {"output_dir": "out"}
"""Old field names still read (with a warning) from TOML files and saved run configs."""


def _renamed(data: dict[str, Any], source: str) -> dict[str, Any]:
    data = dict(data)
    for old, new in RENAMED.items():
        if old not in data:
            continue
        value = data.pop(old)
        if new in data and data[new] != value:
            raise ConfigError(f"{source}: {old} is the old name of {new}; give only {new}")
        logger.warning("%s: %s is deprecated, it is now called %s", source, old, new)
        data.setdefault(new, value)
    return data


PRESETS = {"smollm2": "smollm2.toml"}
"""Models whose default run is a file of its own (``training/NAME.toml``): ``nego train --model NAME`` starts there."""


def model_preset(model: str) -> TrainConfig:
    """The config a run of ``model`` starts from before any option: its preset file, else the defaults."""
    if model not in PRESETS:
        return TrainConfig()
    return load_toml(Path(__file__).with_name(PRESETS[model]))


def load_toml(path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
    """Read a TOML file of TrainConfig fields (top level or under [train])."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{p}: cannot read training config: {e}") from None
    if "train" in data and isinstance(data["train"], dict) and len(data) == 1:
        data = data["train"]
    return from_mapping(data, str(p), base)
