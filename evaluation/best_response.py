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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import numpy as np
from nego.market.marketplace import child_seeds
from nego.market.protocol import Negotiator, ProtocolConfig, run_negotiation
from nego.market.types import Action, ActionKind, Observation, Offer, Turn
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


async def best_response_value(
    scenario: Scenario,
    build_buyer: BuyerFactory,
    seed: int,
    turns: Sequence[Turn],
    score: float,
    config: ProtocolConfig | None = None,
) -> float:
    """Best seller utility reachable by one deviation at a reached seller turn (see the module docstring)."""
    cfg = config or ProtocolConfig()
    front_u, offers = _frontier(scenario)
    buyer_seed = child_seeds(seed)[1]
    best = score
    # later turns first: threshold buyers concede over time, so the best value tends to be found there and each
    # earlier turn then costs a single probe that rules out anything better
    for _, script, standing in reversed(_seller_script(turns)):
        if standing is not None:
            best = max(best, standing)
        # candidates better than what is already reachable, sorted by seller utility descending
        hi = int((front_u > best + 1e-12).sum())
        if hi == 0 or not await _accepts(scenario, build_buyer, buyer_seed, seed, script, offers[hi - 1], cfg):
            continue
        lo_fail, ok = -1, hi - 1  # offers[ok] accepted; find the smallest accepted index by bisection
        while ok - lo_fail > 1:
            mid = (lo_fail + ok) // 2
            if await _accepts(scenario, build_buyer, buyer_seed, seed, script, offers[mid], cfg):
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
