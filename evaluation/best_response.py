"""The seller's best response to a known, replayable buyer, for the optimality-gap metric.

A rule-based buyer's moves depend only on its seed and what it observes, so a negotiation can be replayed
exactly with a fresh buyer built from the same factory and seed. At every seller turn the seller actually
reached, the replay asks: which Pareto-optimal offer with the highest seller utility would the buyer accept
if the seller made it now instead of what it did? The seller replays its recorded moves (invalid attempts
included) up to that turn, makes the probe offer, and the buyer's real answer decides. Accepting the buyer's
standing offer at that turn counts too. The best-response value is the best of these and the actual score, so

    optimality_gap = best_response_value - score >= 0.

Probes walk the frontier by bisection, which assumes the buyer's acceptance is monotone in its own utility
along the frontier (true for threshold acceptors: time-dependent, walker, picky, hardliner). Turns the play
never reached (after an early accept or walk-away) are not probed, so the value is a lower bound of the
unrestricted best response.

A replay need not play the whole negotiation again for every probe: the buyer is advanced once along the recorded
negotiation (its moves checked against the record), a copy of it is kept at every seller turn, and a probe asks a
fresh copy of that turn's buyer for its answer to the probe offer, with the same observation a replay would give it.
Where that cannot be done exactly (a buyer that cannot be copied, or whose moves differ from the record, a message
the protocol would cut, a buyer's invalid move) every probe of the negotiation is a full replay.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Sequence

import numpy as np
from nego.market.marketplace import child_seeds
from nego.market.protocol import Negotiator, ProtocolConfig, check_offer, run_negotiation
from nego.market.types import Action, ActionKind, Observation, Offer, PublicMove, Turn
from nego.scenarios.analysis import analyse, offer_at
from nego.scenarios.scenario import Role, Scenario

BuyerFactory = Callable[[Role, int], Negotiator]


class _ScriptedSeller:
    """Replays recorded seller attempts, then makes one probe offer, then walks away."""

    def __init__(self, script: Sequence[Action], probe: Action) -> None:
        self._moves = [*script, probe]
        self._next = 0

    async def act(self, obs: Observation) -> Action:
        if self._next < len(self._moves):
            self._next += 1
            return self._moves[self._next - 1]
        return Action.walk_away()


def _seller_script(turns: Sequence[Turn]) -> list[tuple[int, list[Action], float | None]]:
    """For every seller turn start: (turn index, seller attempts before it, seller utility of the standing buyer
    offer)."""
    points, script = [], []
    standing: float | None = None
    for t in turns:
        if t.role is Role.SELLER and t.attempt == 0:
            points.append((t.index, list(script), standing))
        if t.role is Role.SELLER:
            script.append(t.action)
        elif t.valid and t.action.kind is ActionKind.OFFER:
            standing = t.utility_seller
    return points


async def _accepts(
    scenario: Scenario,
    build: BuyerFactory,
    buyer_seed: int,
    seed: int,
    script: list[Action],
    offer: Offer,
    config: ProtocolConfig,
) -> bool:
    """Replay the negotiation as the market played it (the buyer built with the child seed it played with, the same
    protocol and negotiation seed) with the seller's recorded attempts, then the probe offer."""
    try:
        buyer = build(Role.BUYER, buyer_seed)
    except Exception:  # the market plays a buyer that cannot be built as an error: nothing is accepted
        return False
    seller = _ScriptedSeller(script, Action.make_offer(offer))
    result = await run_negotiation(scenario, seller, buyer, seed=seed, config=config)
    return result.outcome.agreed and result.outcome.agreement == offer


_FRONTIERS: dict[str, tuple[np.ndarray, list[Offer]]] = {}
_MAX_FRONTIERS = 256


def _frontier(scenario: Scenario) -> tuple[np.ndarray, list[Offer]]:
    """The Pareto frontier's seller utilities (descending) and its offers, worked out once per scenario content (an
    evaluation replays many negotiations of each of its scenarios, each job holding its own scenario object)."""
    key = scenario.content_hash()
    hit = _FRONTIERS.get(key)
    if hit is None:
        if len(_FRONTIERS) >= _MAX_FRONTIERS:
            _FRONTIERS.clear()
        analysis = analyse(scenario)
        offers = [offer_at(scenario, int(i)) for i in analysis.pareto_indices]
        hit = _FRONTIERS[key] = (analysis.pareto_utilities[:, 0], offers)
    return hit


class _Buyers:
    """The buyer as it stood at each seller turn of the recorded negotiation (see the module docstring), and the
    public history a probe at that turn joins."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.view = scenario.view_for(Role.BUYER)
        self.at: dict[int, tuple[Negotiator, tuple[PublicMove, ...], int]] = {}

    def copy(self, buyer: Negotiator) -> Negotiator:
        # the view stays the buyer's own object (a rule negotiator starts afresh on a view it does not know); what it
        # shares with other negotiators (its outcome space, the offers tables) copies as itself
        return copy.deepcopy(buyer, {id(self.view): self.view})

    async def answer(self, index: int, offer: Offer) -> bool | None:
        """Whether the buyer accepts ``offer`` made at seller turn ``index``; None where only a replay can tell."""
        buyer, history, round_ = self.at[index]
        sc = self.scenario
        reply_round = round_ if sc.opener is Role.SELLER else round_ + 1
        if reply_round > sc.max_rounds:  # the probe was the last move of the negotiation: no deal
            return False
        if check_offer(sc, offer)[1] is not None:
            return None  # a replay answers an illegal probe with feedback, then the seller walks away
        probe = PublicMove(round_, Role.SELLER, ActionKind.OFFER, offer, "")
        obs = Observation(self.view, (*history, probe), reply_round, offer, None, 0)
        action = await self.copy(buyer).act(obs)
        if not isinstance(action, Action):
            return None
        if action.kind is ActionKind.ACCEPT:
            return True
        if action.kind is ActionKind.WALK_AWAY or (
            action.kind is ActionKind.OFFER and check_offer(sc, action.offer)[1] is None
        ):
            return False
        return None  # an invalid answer would be retried with feedback: the replay plays that


async def _advance(
    scenario: Scenario, build: BuyerFactory, buyer_seed: int, turns: Sequence[Turn], config: ProtocolConfig
) -> _Buyers | None:
    """The buyer advanced along the recorded ``turns`` with a copy kept at every seller turn, or None where the
    record cannot be followed exactly (see the module docstring)."""
    buyers = _Buyers(scenario)
    try:
        buyer = build(Role.BUYER, buyer_seed)
        history: list[PublicMove] = []
        standing: Offer | None = None
        for t in turns:
            a = t.action
            if len(a.message) > config.max_message_chars:
                return None
            if t.role is Role.SELLER:
                if t.attempt == 0:
                    buyers.at[t.index] = (buyers.copy(buyer), tuple(history), t.round)
            else:
                if t.attempt != 0 or not t.valid:
                    return None
                obs = Observation(buyers.view, tuple(history), t.round, standing, None, 0)
                mine = await buyer.act(obs)
                if not isinstance(mine, Action) or mine.kind is not a.kind or mine.offer != a.offer:
                    return None
            if t.valid:
                offer = a.offer if a.kind is ActionKind.OFFER else None
                history.append(PublicMove(t.round, t.role, a.kind, offer, a.message))
                if offer is not None:
                    standing = offer if t.role is Role.SELLER else None  # the buyer sees the seller's standing offer
    except Exception:
        return None
    return buyers


async def best_response_value(
    scenario: Scenario,
    build_buyer: BuyerFactory,
    seed: int,
    turns: Sequence[Turn],
    score: float,
    config: ProtocolConfig | None = None,
    *,
    fast: bool = True,
) -> float:
    """Best seller utility reachable by one deviation at a reached seller turn (see the module docstring).
    ``fast=False`` replays the whole negotiation for every probe (the same value, more slowly)."""
    cfg = config or ProtocolConfig()
    front_u, offers = _frontier(scenario)
    buyer_seed = child_seeds(seed)[1]
    buyers = await _advance(scenario, build_buyer, buyer_seed, turns, cfg) if fast else None

    async def accepts(index: int, script: list[Action], offer: Offer) -> bool:
        answer = None
        if buyers is not None:
            try:
                answer = await buyers.answer(index, offer)
            except Exception:
                answer = None
        if answer is None:
            answer = await _accepts(scenario, build_buyer, buyer_seed, seed, script, offer, cfg)
        return answer

    best = score
    # later turns first: threshold buyers concede over time, so the best value tends to be found there and each
    # earlier turn then costs a single probe that rules out anything better
    for index, script, standing in reversed(_seller_script(turns)):
        if standing is not None:
            best = max(best, standing)
        # candidates better than what is already reachable, sorted by seller utility descending
        hi = int((front_u > best + 1e-12).sum())
        if hi == 0 or not await accepts(index, script, offers[hi - 1]):
            continue
        lo_fail, ok = -1, hi - 1  # offers[ok] accepted; find the smallest accepted index by bisection
        while ok - lo_fail > 1:
            mid = (lo_fail + ok) // 2
            if await accepts(index, script, offers[mid]):
                ok = mid
            else:
                lo_fail = mid
        best = max(best, float(front_u[ok]))
    return best


def optimality_gap(
    scenario: Scenario,
    build_buyer: BuyerFactory,
    seed: int,
    turns: Sequence[Turn],
    score: float,
    config: ProtocolConfig | None = None,
) -> float:
    """``best_response_value - score`` for one negotiation (synchronous convenience)."""
    return asyncio.run(best_response_value(scenario, build_buyer, seed, turns, score, config)) - score
