"""The GRPO reward: the seller's utility of the structured outcome, never parsed back out of text."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

RewardFunc = Callable[..., list[float]]


def outcome_reward(
    seller_utility: float, agreed: bool, reservation: float, invalid_seller: int, no_deal: float | None, penalty: float
) -> float:
    """Seller utility of a deal; without one the reservation value (or the fixed ``no_deal`` reward);
    minus ``penalty`` per invalid seller action."""
    base = seller_utility if agreed else (reservation if no_deal is None else no_deal)
    return float(base) - penalty * int(invalid_seller)


def make_reward_func(no_deal: float | None = None, invalid_penalty: float = 0.0) -> RewardFunc:
    """A TRL reward function reading the outcome columns that the rollout passes as keyword arguments."""

    def seller_utility(
        prompts: Sequence[Any],
        completions: Sequence[Any],
        *,
        seller_utility: Sequence[float],
        agreed: Sequence[bool],
        reservation: Sequence[float],
        invalid_seller: Sequence[int],
        **_: Any,
    ) -> list[float]:
        return [
            outcome_reward(u, a, r, k, no_deal, invalid_penalty)
            for u, a, r, k in zip(seller_utility, agreed, reservation, invalid_seller, strict=True)
        ]

    return seller_utility
