"""The GRPO reward: the seller's utility of the structured outcome, never parsed back out of text.

The reward is a :data:`~nego.market.marketplace.Scorer`: the episode runner's marketplace applies it to every
negotiation the learner plays and writes it to the transcripts' ``reward`` column; the trainer reads the same
number (:func:`nego.training.rollout.trl_reward`).
"""

from __future__ import annotations

from nego.market.marketplace import Job, Scorer
from nego.market.types import EndReason, NegotiationResult


def outcome_reward(
    seller_utility: float, agreed: bool, reservation: float, invalid_seller: int, no_deal: float | None, penalty: float
) -> float:
    """Seller utility of a deal; without one the reservation value (or the fixed ``no_deal`` reward);
    minus ``penalty`` per invalid seller action."""
    base = seller_utility if agreed else (reservation if no_deal is None else no_deal)
    return float(base) - penalty * int(invalid_seller)


def outcome_scorer(no_deal: float | None = None, invalid_penalty: float = 0.0) -> Scorer:
    """The training reward of a played negotiation (None for one that ended in an error: no outcome to learn from;
    the runner refuses to train on it)."""

    def score(job: Job, result: NegotiationResult) -> float | None:
        o = result.outcome
        if o.end_reason is EndReason.ERROR:
            return None
        reservation = job.scenario.seller.reservation
        return outcome_reward(o.seller_utility, o.agreed, reservation, o.invalid_seller, no_deal, invalid_penalty)

    return score
