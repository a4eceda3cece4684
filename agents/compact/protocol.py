"""The compact word-level protocol and the negotiator that plays it with a tiny in-process language model.

A tiny model cannot read prose, so a negotiation is rendered as a short sequence of words that any generated
scenario fits into, built only from the acting side's own observation:

- header: ``<s> w7 w5 w8 r6`` -- one own-weight bucket per issue in issue order (``w0..w20``, steps of 0.05)
  and the own reservation bucket (``r0..r20``);
- before each own turn: the own utility of the own last offer, ``u14`` (``u0..u20``, steps of 0.05), the other
  side's new offer as own-value levels followed by its own utility and whether that clears the own reservation,
  ``opp L3 L9 L0 u7 above`` (or ``below``), then how the other side has been moving, in own utility: how much it
  has conceded since its first offer, ``c3`` (``c0..c20``, steps of 0.05), and how its last offer moved from its
  previous one, ``d0`` (stalled: under 0.01), ``d1`` (under 0.03), ``d2`` (under 0.07), ``d3`` (more) or ``d-`` (it
  took something back); then the rounds left, ``T4`` (``invalid T4`` when the last attempt was rejected);
- an own turn: ``offer L10 L7 L2 <eot>``, ``accept <eot>`` or ``walk <eot>``; a model whose tokenizer holds the aim
  words may also offer ``offer a62 <eot>``: the outcome with the smallest own utility at or above 0.62 (never below
  the own reservation), the offer a time-dependent rule seller makes for that target;
- the end (rendered by whoever records the episode): ``opp-accept``, ``opp-walk`` or ``deadline``, then ``</s>``.

A level ``k`` of an issue means "own value about k/10" and is played as the grid value of that issue whose own
value is nearest to k/10, so direction and categorical tables never need their own words. An aim ``aK`` names a
whole offer by its own utility (``K/100``): one word decides how much to concede, the choice a bargaining strategy is
about, where levels spread it over a word per issue (:data:`AIMS`). The model is shared
by all negotiators of a factory and its forward passes are batched across concurrent negotiations; each negotiator
keeps the keys and values of what the model has read of its episode, so a turn reads only the words added since its
last one (:mod:`nego.agents.compact.decode`). torch and transformers are imported only when a model is loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from nego.market.types import Action, ActionKind, NegotiationResult, Observation, Offer, Outcome
from nego.scenarios.issues import Issue, Value
from nego.scenarios.preferences import ValueFunction
from nego.scenarios.scenario import Role, ScenarioView

from ..batching import Batcher
from ..rules.base import cheapest_at_least
from ..rules.search import OutcomeSpace
from ..trace import TokenTrace
from ..trend import conceded, move_class

if TYPE_CHECKING:
    from nego.agents.model_registry import ModelEntry

LEVELS = 10
BUCKETS = 20
MAX_ROUNDS_TOKEN = 30
PAD, BOS, EOS, EOT, UNK = "<pad>", "<s>", "</s>", "<eot>", "<unk>"
OFFER, ACCEPT, WALK = "offer", "accept", "walk"
OPP, OPP_ACCEPT, OPP_WALK, DEADLINE, INVALID = "opp", "opp-accept", "opp-walk", "deadline", "invalid"
ABOVE, BELOW = "above", "below"
AIMS = 100
"""Aim words ``a0..a100``: an offer named by its own utility in steps of 0.01."""
MOVES = ("d-", "d0", "d1", "d2", "d3")
"""The other side's last move in own utility, by the classes of :data:`nego.agents.trend.MOVE_EDGES`: took back,
stalled, small, medium, large concession."""


def vocabulary(aims: bool = False) -> list[str]:
    """Every word of the protocol, in id order (fixed: a model and its tokenizer agree on it forever); ``aims`` adds
    the aim words after the rest, for models that offer by own utility (a tokenizer without them plays levels only)."""
    words = [PAD, BOS, EOS, EOT, UNK, OFFER, ACCEPT, WALK, OPP, OPP_ACCEPT, OPP_WALK, DEADLINE, INVALID]
    words += [f"L{k}" for k in range(LEVELS + 1)]
    words += [f"w{k}" for k in range(BUCKETS + 1)]
    words += [f"r{k}" for k in range(BUCKETS + 1)]
    words += [f"T{k}" for k in range(1, MAX_ROUNDS_TOKEN + 1)]
    # appended later (utility words): earlier ids never move
    words += [f"u{k}" for k in range(BUCKETS + 1)]
    words += [ABOVE, BELOW]
    words += [f"c{k}" for k in range(BUCKETS + 1)]  # the other side's concession so far
    words += list(MOVES)
    if aims:
        words += aim_words()
    return words


def aim_words() -> list[str]:
    return [f"a{k}" for k in range(AIMS + 1)]


def _bucket(x: float, n: int) -> int:
    return min(n, max(0, round(x * n)))


def header_words(view: ScenarioView) -> list[str]:
    """The episode's opening words: own weights per issue, own reservation."""
    prefs = view.preferences
    return [
        BOS,
        *(f"w{_bucket(prefs.weights[i.name], BUCKETS)}" for i in view.issues),
        f"r{_bucket(prefs.reservation, BUCKETS)}",
    ]


def offer_levels(view: ScenarioView, offer: Offer) -> list[int]:
    """An offer as own-value levels per issue, from this side's own value functions only."""
    prefs = view.preferences
    return [_bucket(prefs.values[i.name](i, offer[i.name]), LEVELS) for i in view.issues]


def utility_words(view: ScenarioView, offer: Offer, opponent: bool) -> list[str]:
    """An offer's own utility as a bucket word; for the other side's offers also whether it clears the own
    reservation (exactly, so a small model can copy "never accept below reservation" instead of estimating it)."""
    u = view.utility(offer)
    words = [f"u{_bucket(u, BUCKETS)}"]
    if opponent:
        words.append(ABOVE if u >= view.preferences.reservation else BELOW)
    return words


def level_offer(view: ScenarioView, levels: Sequence[int]) -> Offer:
    """Each level played as the issue's grid value whose own value is nearest ``level/10`` (first on ties)."""
    prefs = view.preferences
    return Offer(
        {
            issue.name: _level_values(issue, prefs.values[issue.name])[level]
            for issue, level in zip(view.issues, levels, strict=True)
        }
    )


@lru_cache(maxsize=16384)
def _level_values(issue: Issue, vf: ValueFunction) -> tuple[Value, ...]:
    """The grid value each level ``0..LEVELS`` stands for (a search over the grid, done once per issue and side)."""
    grid = issue.grid()
    own = [vf(issue, v) for v in grid]
    return tuple(grid[min(range(len(grid)), key=lambda j: abs(own[j] - k / LEVELS))] for k in range(LEVELS + 1))


def trend_words(opponent_utilities: Sequence[float]) -> list[str]:
    """How the other side has been moving, in own utility: its concession since its first offer and, once it has made
    two offers, the size of its last move (see :data:`MOVES`)."""
    if not opponent_utilities:
        return []
    words = [f"c{_bucket(conceded(opponent_utilities), BUCKETS)}"]
    kind = move_class(opponent_utilities)
    if kind is not None:
        words.append(MOVES[kind])
    return words


def rounds_word(obs: Observation) -> str:
    return f"T{min(MAX_ROUNDS_TOKEN, max(1, obs.rounds_left))}"


def aim_offer(view: ScenarioView, aim: int, space: OutcomeSpace | None = None) -> Offer:
    """The offer an aim word stands for: the outcome with the smallest own utility at or above ``aim / AIMS`` that
    clears the own reservation (the best outcome when none does), found in ``space`` (this side's outcome space)."""
    space = space or OutcomeSpace(view.issues, view.preferences)
    return space.offer(cheapest_at_least(space, aim / AIMS, view.preferences.reservation))


def action_words(view: ScenarioView, action: Action, aims: bool = False) -> list[str]:
    """An own action in protocol words (used to record rule-based sellers for behaviour cloning); ``aims`` writes an
    offer as the aim nearest its own utility instead of its levels."""
    if action.kind is ActionKind.OFFER and action.offer is not None:
        if aims:
            return [OFFER, f"a{min(AIMS, max(0, round(view.utility(action.offer) * AIMS)))}", EOT]
        return [OFFER, *(f"L{k}" for k in offer_levels(view, action.offer)), EOT]
    if action.kind is ActionKind.ACCEPT:
        return [ACCEPT, EOT]
    if action.kind is ActionKind.WALK_AWAY:
        return [WALK, EOT]
    raise ValueError(f"cannot render a {action.kind} action in the compact protocol")


def parse_action(view: ScenarioView, words: Sequence[str], space: Callable[[], OutcomeSpace] | None = None) -> Action:
    """Generated words of one turn (``<eot>`` included) -> an Action; anything malformed -> an INVALID action.
    ``space`` returns this side's outcome space when an aim needs it (a negotiator's kept one, instead of a new one)."""
    raw = " ".join(words)
    if not words or words[-1] != EOT:
        return Action.invalid(raw, "the turn did not end with <eot>")
    body = list(words[:-1])
    if body == [ACCEPT]:
        return Action(ActionKind.ACCEPT, raw=raw)
    if body == [WALK]:
        return Action(ActionKind.WALK_AWAY, raw=raw)
    if len(body) == 2 and body[0] == OFFER and body[1][:1] == "a" and body[1][1:].isdigit():
        aim = int(body[1][1:])
        if aim <= AIMS:
            return Action(ActionKind.OFFER, aim_offer(view, aim, space() if space else None), raw=raw)
    n = len(view.issues)
    if len(body) == n + 1 and body[0] == OFFER and all(w[:1] == "L" and w[1:].isdigit() for w in body[1:]):
        levels = [int(w[1:]) for w in body[1:]]
        if all(0 <= k <= LEVELS for k in levels):
            offer = level_offer(view, levels)
            return Action(ActionKind.OFFER, offer, raw=raw)
    return Action.invalid(
        raw, f"expected 'offer' and {n} levels or one aim, 'accept' or 'walk', then <eot>; got {raw!r}"
    )


def end_words(outcome: Outcome, role: Role) -> list[str]:
    """The closing words after this side's last turn: how the other side (or the clock) ended it, then EOS."""
    if outcome.ended_by is role.other and outcome.agreed:
        return [OPP_ACCEPT, EOS]
    if outcome.ended_by is role.other:
        return [OPP_WALK, EOS]
    if outcome.ended_by is None:
        return [DEADLINE, EOS]
    return [EOS]


@dataclass(slots=True)
class CompactTrace:
    """One side's episode as token words: ``prompt`` (the header) and the rest with a 1/0 own-token mask."""

    role: Role
    prompt: list[str] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    seen_moves: int = 0
    opponent_utilities: list[float] = field(default_factory=list)
    _space: OutcomeSpace | None = field(default=None, compare=False, repr=False)

    def outcome_space(self, view: ScenarioView) -> OutcomeSpace:
        """This side's outcome space for the episode's scenario (built on first use, for aim offers)."""
        if self._space is None:
            self._space = OutcomeSpace(view.issues, view.preferences)
        return self._space

    def observe(self, obs: Observation) -> None:
        """Append the environment words this observation adds (masked out of any loss)."""
        if not self.prompt:
            self.prompt = header_words(obs.scenario)
        env: list[str] = []
        view = obs.scenario
        seen = len(self.opponent_utilities)
        for move in obs.history[self.seen_moves :]:
            if move.kind is not ActionKind.OFFER or move.offer is None:
                continue
            if move.role is self.role:
                env += utility_words(view, move.offer, opponent=False)
            else:
                env += [OPP, *(f"L{k}" for k in offer_levels(view, move.offer)), *utility_words(view, move.offer, True)]
                self.opponent_utilities.append(view.utility(move.offer))
        if len(self.opponent_utilities) > seen:
            env += trend_words(self.opponent_utilities)
        self.seen_moves = len(obs.history)
        if obs.feedback is not None:
            env.append(INVALID)
        env.append(rounds_word(obs))
        self.add(env, own=False)

    def add(self, words: Sequence[str], own: bool, logprobs: Sequence[float] | None = None) -> None:
        self.words += words
        self.mask += [int(own)] * len(words)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(words)

    def finish(self, outcome: Outcome) -> None:
        self.add(end_words(outcome, self.role), own=False)
        self._space = None  # the episode is over: nothing more to offer


class CompactPolicy:
    """A compact-protocol model shared by many negotiators; concurrent requests become one batched forward pass.

    With ``keep_cache`` (the default, on the Qwen2 models ``nego train`` builds) each negotiator keeps the keys and
    values of what the model has read of its episode, so a turn reads only the words added since its last turn;
    ``keep_cache=False`` re-reads the whole episode every turn (the same tokens, log-probabilities equal up to float
    rounding, slower; ``bench/grpo_profile.py --compare`` measures the two)."""

    def __init__(self, model: Any, tokenizer: Any, *, max_context: int | None = None, keep_cache: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        missing = [w for w in vocabulary() if w not in vocab]  # aim words are optional
        if missing:
            raise ValueError(
                f"this model's tokenizer lacks {len(missing)} compact-protocol words (e.g. {missing[0]!r}): it was "
                "trained with an older protocol; train it again with `nego train`"
            )
        self.ids = {w: vocab[w] for w in vocabulary(aims=True) if w in vocab}
        self.words = {i: w for w, i in self.ids.items()}
        self.max_context = max_context or int(getattr(model.config, "max_position_embeddings", 1024))
        if keep_cache:
            from .decode import supports_kept_cache

            keep_cache = supports_kept_cache(model)
        self.keep_cache = keep_cache
        # one batch holds every negotiation about to ask, however long the clock says they took to get there
        self.batcher: Batcher[_Request, tuple[list[int], list[float]]] = Batcher(
            lambda batch: generate_turns(self.model, batch, pad_id=self.ids[PAD], stop_id=self.ids[EOT]),
            max_batch=sys.maxsize,
            window_s=None,
            failure=lambda e: e,
            in_thread=False,
            name="compact-policy",
        )

    @property
    def forward_calls(self) -> int:
        return self.batcher.batches

    def token_trace(self, trace: CompactTrace) -> TokenTrace:
        """A word trace as token ids of this policy's vocabulary."""
        ids = self.ids
        return TokenTrace(
            tuple(ids[w] for w in trace.prompt),
            tuple(ids[w] for w in trace.words),
            tuple(trace.mask),
            tuple(trace.logprobs),
        )

    @classmethod
    def load(cls, path: str) -> CompactPolicy:
        """Load a saved model and tokenizer through the normal transformers path."""
        try:
            from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
        except ImportError as e:
            raise ImportError("compact models need the training extra: pip install 'nego[train]'") from e
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        model.eval()
        return cls(model, tokenizer)

    def new_cache(self) -> KVCache | None:
        """A fresh cache for one negotiation, or None when this policy re-reads every turn."""
        return KVCache() if self.keep_cache else None

    async def generate(
        self,
        words: Sequence[str],
        max_new: int,
        temperature: float | None,
        generator: Any = None,
        cache: KVCache | None = None,
    ) -> tuple[list[str], list[float]]:
        """Continue ``words`` until ``<eot>`` or ``max_new`` words; greedy when ``temperature`` is None. A ``cache``
        (from :meth:`new_cache`, one per negotiation) saves reading again what an earlier turn already read."""
        ids = [self.ids.get(w, self.ids[UNK]) for w in words]
        if len(ids) + max_new > self.max_context:
            raise RuntimeError(f"episode context of {len(ids) + max_new} tokens exceeds the model's {self.max_context}")
        (out_ids, logps), _ = await self.batcher.submit(_Request(ids, max_new, temperature, generator, cache))
        return [self.words[i] for i in out_ids], logps


def generate_turns(model: Any, batch: Sequence[Any], pad_id: int, stop_id: int) -> list[tuple[list[int], list[float]]]:
    """One batched, KV-cached decoding call (see :func:`nego.agents.compact.decode.generate_turns`; torch loads
    only here)."""
    from .decode import generate_turns as run

    return run(model, batch, pad_id, stop_id)


@dataclass(slots=True)
class KVCache:
    """What the model has read of one negotiation: the token ids and their keys and values per layer
    (``[layers, 2, kv_heads, len(ids), head_dim]``; None before the first turn). One negotiator owns it; it is
    valid for the weights that wrote it, which never change during a negotiation."""

    ids: list[int] = field(default_factory=list)
    kv: Any = None


@dataclass(slots=True)
class _Request:
    ids: list[int]
    max_new: int
    temperature: float | None
    generator: Any
    cache: KVCache | None = None


class CompactNegotiator:
    """Plays the compact protocol through the normal market protocol, recording its episode as a trace; at the end
    the market collects it as a :class:`~nego.agents.trace.TokenTrace` (see :class:`nego.market.marketplace.Recorder`).
    """

    def __init__(self, policy: CompactPolicy, role: Role, seed: int, temperature: float | None = None) -> None:
        self.policy = policy
        self.trace = CompactTrace(Role(role))
        self.temperature = temperature
        self.cache = policy.new_cache()
        self.generator = None
        if temperature is not None:
            import torch

            self.generator = torch.Generator().manual_seed(int(seed))

    async def act(self, obs: Observation) -> Action:
        self.trace.observe(obs)
        max_new = len(obs.scenario.issues) + 2
        words, logps = await self.policy.generate(
            self.trace.prompt + self.trace.words, max_new, self.temperature, self.generator, self.cache
        )
        self.trace.add(words, own=True, logprobs=logps)
        return parse_action(obs.scenario, words, lambda: self.trace.outcome_space(obs.scenario))

    def record(self, result: NegotiationResult) -> TokenTrace:
        """The finished episode (closing words added) as token ids of the policy's vocabulary."""
        self.cache = None  # the episode is over: nothing more to read
        self.trace.finish(result.outcome)
        return self.policy.token_trace(self.trace)


@dataclass
class CompactFactory:
    """Builds negotiators that share one loaded compact model (``spec`` is the registered name)."""

    spec: str
    policy: CompactPolicy
    temperature: float | None = None
    kind: str = "compact"

    def __call__(self, role: Role | str, seed: int) -> CompactNegotiator:
        return CompactNegotiator(self.policy, Role(role), seed, self.temperature)


def make_factory(entry: ModelEntry, temperature: float | None = None) -> CompactFactory:
    """A factory for a registered compact model.

    ``temperature`` None plays the policy as it was trained: sampling at the temperature of its training rollouts
    (recorded in the registry; 1.0 when absent), seeded per negotiation so a rerun plays the same moves. GRPO
    optimises that sampled policy, and its greedy argmax can be a different strategy altogether (a per-token mode
    of offers that concede on varying issues keeps every issue at its best level). ``0`` plays greedily; any other
    value samples at that temperature.
    """
    if entry.format != "compact":
        raise ValueError(f"model {entry.name!r} has format {entry.format!r}; make_factory plays 'compact' models only")
    if temperature is None:
        temperature = float(entry.config.get("temperature", 1.0))
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return CompactFactory(entry.name, CompactPolicy.load(entry.path), temperature or None)
