"""How long chat episodes are, measured before any weights load: rule-based sellers play the training split
against the training buyer pool, and each seller's side is rendered as the token sequence the chat rollout builds.

The layout is the chat rollout's own (``training/chat_rollout.py``): at every turn the conversation of the
conversation template (:func:`~nego.agents.llm.chat_layout.chat_messages`) is rendered through the model's chat
template, and each reply, its text followed by EOS, is recorded by the same :class:`~.chat_rollout.ChatTrace`. Rule
sellers reply with the bare JSON action block the parser understands (a model usually writes a message and some
prose too, which the margin of the episode cap is for).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from nego.agents.llm.backends.hf import chat_ids
from nego.agents.llm.backends.hf_engine import Generated
from nego.agents.llm.chat_layout import CHAT_TEMPLATE, Exchange, chat_messages
from nego.agents.llm.parsing import action_to_json, read_envelope
from nego.agents.llm.prompts import load_template
from nego.agents.registry import resolve
from nego.market.marketplace import Job, run_jobs
from nego.market.types import Action, ActionKind, NegotiationResult, Observation, PublicMove, Turn
from nego.scenarios.scenario import Role, Scenario

from .chat_rollout import ChatTrace
from .pool import BuyerPool
from .rollout import split_scenarios

WARM_START_SELLERS = ("timedep:e=0.3", "timedep:e=1", "timedep:e=3")


@dataclass(frozen=True, slots=True)
class ChatEpisode:
    """One side's negotiation as the chat rollout lays it out: the first prompt, then every later id with its
    loss mask (1 for the side's own replies, 0 for what the environment adds)."""

    prompt: list[int]
    ids: list[int]
    mask: list[int]
    turns: int


def reply_text(action: Action, *, line: bool = False) -> str:
    """What a chat model would have written for ``action``: a model's own text when the action recorded one
    (its raw reply envelope), otherwise the JSON action block the prompt asks for (``line``: the one line of JSON
    without a message that a template using ``reply_line`` asks for)."""
    if action.raw:
        try:
            return str(read_envelope(action.raw)["text"])
        except ValueError:
            return action.raw
    if action.kind is ActionKind.INVALID:
        return action.error
    if line:
        body = action_to_json(action)
        body.pop("message", None)
        return json.dumps(body)
    return "```json\n" + json.dumps(action_to_json(action)) + "\n```"


def observations(
    scenario: Scenario, result: NegotiationResult, role: Role = Role.SELLER
) -> Iterator[tuple[Observation, Turn]]:
    """Replay ``result`` and yield, for every move ``role`` attempted, the observation it acted on and its turn
    (the protocol's own bookkeeping: public history of valid moves, the other side's standing offer, feedback on
    a retried attempt)."""
    view = scenario.view_for(role)
    history: list[PublicMove] = []
    standing, standing_by, feedback = None, None, None
    for turn in result.turns:
        if turn.role is role:
            yield (
                Observation(
                    scenario=view,
                    history=tuple(history),
                    round=turn.round,
                    standing_offer=standing if standing_by is not role else None,
                    feedback=feedback if turn.attempt > 0 else None,
                    attempt=turn.attempt,
                ),
                turn,
            )
            feedback = turn.feedback
        if turn.valid:
            offer = turn.action.offer if turn.action.kind is ActionKind.OFFER else None
            history.append(PublicMove(turn.round, turn.role, turn.action.kind, offer, turn.action.message))
            if offer is not None:
                standing, standing_by = offer, turn.role


def eos_id(tokenizer: Any) -> int:
    eos = tokenizer.eos_token_id
    return int(eos[0] if isinstance(eos, list) else eos)


def render_episode(
    tokenizer: Any,
    scenario: Scenario,
    result: NegotiationResult,
    *,
    role: Role = Role.SELLER,
    template: str = CHAT_TEMPLATE,
) -> ChatEpisode:
    """``role``'s side of a played negotiation as chat token ids, laid out exactly as the chat rollout lays out
    a live one whose model wrote these replies. An invalid reply (a repair example's, :mod:`.repairs`) is masked out:
    what follows its feedback is the reply to learn."""
    tmpl = load_template(template)
    eos = eos_id(tokenizer)
    trace = ChatTrace()
    exchanges: list[Exchange] = []
    for obs, turn in observations(scenario, result, role):
        trace.extend(chat_ids(tokenizer, chat_messages(tmpl, exchanges, obs, tools=False)))
        text = reply_text(turn.action, line=tmpl.line_replies)
        reply = (*tokenizer.encode(text, add_special_tokens=False), eos) if turn.valid else ()
        trace.generated(Generated(reply, (0.0,) * len(reply), True))  # an invalid reply is context only
        exchanges.append(Exchange(obs, text))
    episode = trace.close((eos,), eos)
    return ChatEpisode(list(episode.prompt_ids), list(episode.completion_ids), list(episode.mask), len(exchanges))


@dataclass(frozen=True, slots=True)
class Spread:
    """Percentiles of a set of token counts (each an observed value, never interpolated)."""

    p50: int
    p90: int
    p99: int
    max: int

    @staticmethod
    def of(values: Sequence[int]) -> Spread:
        if not values:
            raise ValueError("no values to summarise")
        arr = np.asarray(values)
        p50, p90, p99 = (int(np.percentile(arr, q, method="higher")) for q in (50, 90, 99))
        return Spread(p50, p90, p99, int(arr.max()))

    def __str__(self) -> str:
        return f"p50 {self.p50}, p90 {self.p90}, p99 {self.p99}, max {self.max}"


@dataclass(frozen=True, slots=True)
class EpisodeLengths:
    """Token counts of measured episodes: ``episode`` counts the ids after the first prompt (what ``max_tokens``
    caps), ``prompt`` the first prompt, ``turns`` the side's attempted moves."""

    episodes: int
    max_rounds: int
    episode: Spread
    prompt: Spread
    turns: Spread
    source: str = field(default="")


def play_rule_episodes(
    n: int,
    *,
    max_rounds: int,
    buyers: Sequence[str],
    sellers: Sequence[str] = WARM_START_SELLERS,
    seed: int = 0,
) -> list[tuple[Scenario, NegotiationResult]]:
    """``n`` negotiations on the training split through the market: seller ``i`` is ``sellers[i % len]``, each
    buyer is drawn from the training pool (ranges resolved per negotiation), seeds derive from ``seed``."""
    pool = BuyerPool(tuple(buyers)).rules()  # rule sellers stand in for the policy, so no league buyer either
    rng = np.random.default_rng([seed, 4242])
    scenarios = split_scenarios("train", n, max_rounds)
    jobs = [
        Job(sc, sellers[i % len(sellers)], pool.draw(rng), int(rng.integers(2**31))) for i, sc in enumerate(scenarios)
    ]
    results = run_jobs(resolve, jobs, concurrency=64)
    return list(zip(scenarios, results, strict=True))


def measure(
    tokenizer: Any,
    played: Sequence[tuple[Scenario, NegotiationResult]],
    *,
    template: str = CHAT_TEMPLATE,
    source: str = "",
) -> tuple[EpisodeLengths, list[int]]:
    """(summary, per-episode token counts after the prompt) of ``played`` rendered with ``tokenizer``."""
    rendered = [render_episode(tokenizer, sc, res, template=template) for sc, res in played]
    counts = [len(e.ids) for e in rendered]
    rounds = max((sc.max_rounds for sc, _ in played), default=0)
    summary = EpisodeLengths(
        len(rendered),
        rounds,
        Spread.of(counts),
        Spread.of([len(e.prompt) for e in rendered]),
        Spread.of([e.turns for e in rendered]),
        source,
    )
    return summary, counts


def measure_episode_lengths(
    tokenizer: Any,
    *,
    n: int = 64,
    max_rounds: int = 10,
    buyers: Sequence[str],
    sellers: Sequence[str] = WARM_START_SELLERS,
    seed: int = 0,
    template: str = CHAT_TEMPLATE,
) -> EpisodeLengths:
    """Play ``n`` rule-seller negotiations and measure their chat episodes with ``tokenizer`` (about a second
    for 64 negotiations)."""
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    played = play_rule_episodes(n, max_rounds=max_rounds, buyers=buyers, sellers=sellers, seed=seed)
    source = f"{n} rule-seller episodes ({', '.join(sellers)}), tokenizer {name}"
    return measure(tokenizer, played, template=template, source=source)[0]
