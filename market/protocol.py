"""The alternating-offers protocol: one negotiation between two negotiators, from first offer to outcome."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nego.scenarios.issues import InvalidValueError, Issue
from nego.scenarios.preferences import pair_scorer
from nego.scenarios.scenario import Role, Scenario

from .types import (
    Action,
    ActionKind,
    EndReason,
    NegotiationResult,
    Observation,
    Offer,
    Outcome,
    PublicMove,
    Turn,
    Usage,
)

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 2000
"""Default cap on the message one side is shown of the other's move (see :attr:`ProtocolConfig.max_message_chars`)."""


@runtime_checkable
class Negotiator(Protocol):
    """Anything that can bargain: given what its side may see, return its next action."""

    async def act(self, obs: Observation) -> Action: ...


class NegotiatorError(RuntimeError):
    """A negotiator could not act at all (its backend kept failing); the negotiation ends with an error outcome."""


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    """Rules of the game that are not part of a scenario."""

    max_retries: int = 2
    """Invalid attempts answered with feedback before the turn is forfeited (so 1 + max_retries tries)."""
    turn_timeout_s: float | None = None
    """Wall-clock limit for one call of ``act``; past it the negotiation ends with an error outcome."""
    max_message_chars: int = MAX_MESSAGE_CHARS
    """Longest message the other side is shown; a longer one is cut there, with a note of how much was cut, and
    logged. The transcript keeps the message whole."""

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.max_message_chars < 1:
            raise ValueError(f"max_message_chars must be >= 1, got {self.max_message_chars}")
        if self.turn_timeout_s is not None and self.turn_timeout_s <= 0:
            raise ValueError(f"turn_timeout_s must be positive, got {self.turn_timeout_s}")


def check_offer(scenario: Scenario, offer: Offer | None) -> tuple[Offer | None, str | None]:
    """Validate an offer against the scenario. Returns (normalised offer, None) or (None, feedback).

    The normalised offer is ``offer`` itself when every value already has its issue's type."""
    if offer is None:
        return None, "an offer must assign a value to every issue; none was given"
    issues = scenario.issues
    if isinstance(offer, Offer) and offer._valid_for is issues:  # checked before: offers are immutable
        return offer, None
    if len(offer) == len(issues):
        try:  # fast path: exactly the issue names, every value already legal and normalised
            if all(issue.validate(offer[issue.name]) is offer[issue.name] for issue in issues):
                if isinstance(offer, Offer):
                    offer._valid_for = issues
                return offer, None
        except (KeyError, InvalidValueError):
            pass
    return check_values(offer, issues)


def check_values(values: Mapping[str, object], issues: tuple[Issue, ...]) -> tuple[Offer | None, str | None]:
    """(normalised offer, None) or (None, every problem found): unknown issues, missing ones, bad values."""
    names = [i.name for i in issues]
    problems = []
    unknown = [k for k in values if k not in names]
    if unknown:
        problems.append(f"unknown issue(s) {', '.join(map(repr, unknown))}; the issues are {', '.join(names)}")
    missing = [n for n in names if n not in values]
    if missing:
        problems.append(f"missing value(s) for {', '.join(missing)}: an offer must be complete")
    normalised = {}
    for issue in issues:
        if issue.name in values:
            try:
                normalised[issue.name] = issue.validate(values[issue.name])
            except InvalidValueError as e:
                problems.append(str(e))
    if problems:
        return None, "; ".join(problems)
    return Offer.known_valid(normalised, issues), None  # every value just validated for these issues


async def run_negotiation(
    scenario: Scenario,
    seller: Negotiator,
    buyer: Negotiator,
    *,
    seed: int = 0,
    config: ProtocolConfig | None = None,
    on_turn: Callable[[Turn], None] | None = None,
) -> NegotiationResult:
    """Play one negotiation to its end and return every turn and the outcome.

    Each side receives only its own :class:`Observation`. Invalid actions get feedback and up to
    ``config.max_retries`` retries, then the turn is forfeited; nothing is silently repaired.
    The result depends only on (scenario, negotiators, seed): negotiators derive their randomness from the
    seed they were built with, and this function uses none.
    """
    cfg = config or ProtocolConfig()
    game = _Game(scenario, seed, on_turn, cfg.max_message_chars)
    sides = ((scenario.opener, seller if scenario.opener is Role.SELLER else buyer),)
    sides += ((scenario.opener.other, buyer if scenario.opener is Role.SELLER else seller),)
    attempts = range(cfg.max_retries + 1)
    timeout = cfg.turn_timeout_s
    for rnd in range(1, scenario.max_rounds + 1):
        for role, agent in sides:
            # one side's turn: up to 1 + max_retries attempts (inlined: this loop is the protocol's hot path)
            feedback: str | None = None
            view = game.views[role]
            for attempt in attempts:
                standing = game.standing if game.standing_by is not role else None
                obs = Observation(view, tuple(game.history), rnd, standing, feedback, attempt)
                try:
                    if timeout is None:
                        action = await agent.act(obs)
                    else:
                        action = await asyncio.wait_for(agent.act(obs), timeout)
                except TimeoutError:
                    return game.result(EndReason.ERROR, rnd, role, error=f"{role} did not act within {timeout} s")
                except Exception as e:  # a failing backend ends this negotiation, never the market
                    return game.result(EndReason.ERROR, rnd, role, error=f"{role}: {type(e).__name__}: {e}")
                feedback, action = judge(game.scenario, action, game.standing, game.standing_by, role)
                game.record(rnd, role, attempt, action, feedback)
                if feedback is not None:
                    continue
                if action.kind is ActionKind.ACCEPT:
                    return game.result(EndReason.AGREEMENT, rnd, role, agreement=game.standing)
                if action.kind is ActionKind.WALK_AWAY:
                    return game.result(EndReason.WALK_AWAY, rnd, role)
                game.standing, game.standing_by = action.offer, role
                break
            else:
                game.forfeits[role] += 1
    return game.result(EndReason.DEADLINE, scenario.max_rounds, None)


class _Game:
    """The state of one negotiation while it is played: the public history, the standing offer and the counts."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int,
        on_turn: Callable[[Turn], None] | None,
        max_message_chars: int = MAX_MESSAGE_CHARS,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.on_turn = on_turn
        self.max_message_chars = max_message_chars
        self.views = {Role.SELLER: scenario.view_for(Role.SELLER), Role.BUYER: scenario.view_for(Role.BUYER)}
        self.utilities = pair_scorer(scenario.seller, scenario.buyer, scenario.issues)
        self.history: list[PublicMove] = []
        self.turns: list[Turn] = []
        self.standing: Offer | None = None
        self.standing_by: Role | None = None
        self.invalid = {Role.SELLER: 0, Role.BUYER: 0}
        self.forfeits = {Role.SELLER: 0, Role.BUYER: 0}
        self.usage = {Role.SELLER: Usage(), Role.BUYER: Usage()}
        self._scores: dict[int, tuple[Offer, float, float]] = {}

    def record(self, rnd: int, role: Role, attempt: int, action: Action, feedback: str | None) -> None:
        """Record an attempted move; a valid one also joins the public history."""
        if action.usage is not None:
            self.usage[role] = self.usage[role] + action.usage
        valid = feedback is None
        offer = action.offer if valid and action.kind is ActionKind.OFFER else None
        if offer is None:
            us = ub = None
        else:
            hit = self._scores.get(id(offer))
            us, ub = (hit[1], hit[2]) if hit is not None else self._score(offer)  # scores(), inlined
        turn = Turn(len(self.turns), rnd, role, attempt, action, valid, feedback, us, ub)
        self.turns.append(turn)
        if self.on_turn is not None:
            self.on_turn(turn)
        if valid:
            message = action.message
            if len(message) > self.max_message_chars:
                message = self.shown(message, role, rnd)
            self.history.append(PublicMove(rnd, role, action.kind, offer, message))
        else:
            self.invalid[role] += 1

    def scores(self, offer: Offer) -> tuple[float, float]:
        """(seller utility, buyer utility) of ``offer``, computed once per offer object in this negotiation (the
        cache keeps each offer alive, so its id is not reused meanwhile)."""
        hit = self._scores.get(id(offer))
        return (hit[1], hit[2]) if hit is not None else self._score(offer)

    def _score(self, offer: Offer) -> tuple[float, float]:
        """Both utilities of an offer not scored yet in this negotiation, remembered for the next time."""
        us, ub = self.utilities(offer.as_mapping() if type(offer) is Offer else offer)
        self._scores[id(offer)] = (offer, us, ub)
        return us, ub

    def shown(self, message: str, role: Role, rnd: int) -> str:
        """``message`` as the other side sees it: whole, or cut at ``max_message_chars`` with a note saying so."""
        over = len(message) - self.max_message_chars
        if over <= 0:
            return message
        log.warning(
            "%s: the %s's message in round %d has %d characters; the other side is shown the first %d",
            self.scenario.id,
            role,
            rnd,
            len(message),
            self.max_message_chars,
        )
        return f"{message[: self.max_message_chars]}... [{over} more characters not shown]"

    def result(
        self, reason: EndReason, rnd: int, by: Role | None, agreement: Offer | None = None, error: str = ""
    ) -> NegotiationResult:
        sc = self.scenario
        if agreement is not None:
            us, ub = self.scores(agreement)
        else:
            us, ub = sc.seller.reservation, sc.buyer.reservation
        outcome = Outcome(
            end_reason=reason,
            agreement=agreement,
            seller_utility=us,
            buyer_utility=ub,
            rounds=rnd,
            turns=len(self.turns),
            ended_by=by,
            invalid_seller=self.invalid[Role.SELLER],
            invalid_buyer=self.invalid[Role.BUYER],
            forfeits_seller=self.forfeits[Role.SELLER],
            forfeits_buyer=self.forfeits[Role.BUYER],
            error=error,
        )
        return NegotiationResult(
            sc.id, self.seed, outcome, tuple(self.turns), self.usage[Role.SELLER], self.usage[Role.BUYER]
        )


def judge(
    scenario: Scenario, action: Action, standing: Offer | None, standing_by: Role | None, role: Role
) -> tuple[str | None, Action]:
    """(feedback, action): feedback is None if the action is legal now; a legal offer comes back normalised."""
    if not isinstance(action, Action):
        return f"act() must return an Action, got {type(action).__name__}", Action.invalid(repr(action), "")
    if action.kind is ActionKind.INVALID:
        return action.error or "the reply could not be understood as an action", action
    if action.kind is ActionKind.ACCEPT:
        if standing is None or standing_by is role:
            return "there is no offer from the other side to accept yet; make an offer instead", action
        return None, action
    if action.kind is ActionKind.OFFER:
        offer, feedback = check_offer(scenario, action.offer)
        if feedback is not None:
            return feedback, action
        if offer is not action.offer:
            action = Action(action.kind, offer, action.message, action.raw, action.error, action.usage)
        return None, action
    return None, action
