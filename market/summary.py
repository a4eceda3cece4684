"""Per-agent summaries of a run: deal rate, utilities, rounds, invalid actions, errors, tokens and cost.

:func:`summarize` reads a negotiations table; :class:`RunningStats` computes the same numbers incrementally from
:class:`~nego.market.events.NegotiationEnded` events, for a live view. Errors are counted apart: they are
neither deals nor no-deals, and the rates and means are over the negotiations that did not fail.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import polars as pl
from nego.scenarios.scenario import Role

from .events import NegotiationEnded
from .rates import deal_rate, deal_rate_expr, invalid_moves, invalid_per_move, invalid_per_move_expr, moves
from .types import EndReason, NegotiationResult

Side = Literal["seller", "buyer"]

SUMMARY_SCHEMA = pl.Schema(
    {
        "spec": pl.String,
        "n": pl.Int64,
        "deals": pl.Int64,
        "deal_rate": pl.Float64,
        "mean_seller_utility": pl.Float64,
        "mean_buyer_utility": pl.Float64,
        "mean_rounds": pl.Float64,
        "invalid_rate": pl.Float64,
        "errors": pl.Int64,
        "tokens": pl.Int64,
        "cost_usd": pl.Float64,
    }
)
"""One row per spec. ``n`` counts negotiations including errors; ``deal_rate`` (deals per negotiation), the mean
utilities and ``mean_rounds`` are over the ``n - errors`` that did not fail (null if none); ``invalid_rate`` is this
side's invalid moves per move (:func:`~nego.market.rates.invalid_per_move`, pooled over all ``n``, the moves made
before an error included); ``tokens`` and ``cost_usd`` are what this side's agents spent."""


def learning_days(negotiations: pl.DataFrame) -> pl.DataFrame:
    """Per day: each learning seller's negotiations (its rollouts included), deal rate (per negotiation), mean
    utility, invalid moves per seller move (``invalid_rate``) and the policy version that played, next to the fixed
    sellers' deal rate and mean utility, all over the negotiations that did not fail. Learning sellers are those
    whose negotiations carry a policy version; empty if there are none."""
    latest = negotiations.filter(pl.col("attempt") == pl.col("attempt").max().over("negotiation_id"))
    ok = latest.filter((pl.col("end_reason") != EndReason.ERROR.value) & pl.col("day").is_not_null())
    learning = set(ok.filter(pl.col("policy_version").is_not_null())["seller"].unique().to_list())
    if not learning:
        return pl.DataFrame()
    others = (
        ok.filter(~pl.col("seller").is_in(list(learning)))
        .group_by("day")
        .agg(
            deal_rate_expr().alias("others_deal_rate"),
            pl.col("seller_utility").mean().alias("others_utility"),
        )
    )
    mine = (
        ok.filter(pl.col("seller").is_in(list(learning)))
        .group_by("day", "seller")
        .agg(
            pl.len().alias("n"),
            deal_rate_expr().alias("deal_rate"),
            pl.col("seller_utility").mean().alias("utility"),
            invalid_per_move_expr(Role.SELLER).alias("invalid_rate"),
            pl.col("policy_version").max().alias("policy_version"),
        )
    )
    return mine.join(others, on="day", how="left").sort("seller", "day")


def summarize(negotiations: pl.DataFrame, by: Side = "seller") -> pl.DataFrame:
    """Summary per ``by`` spec of a negotiations table (only the latest attempt of each negotiation counts)."""
    if by not in ("seller", "buyer"):
        raise ValueError(f"by must be 'seller' or 'buyer', got {by!r}")
    latest = negotiations.filter(pl.col("attempt") == pl.col("attempt").max().over("negotiation_id"))
    ok = pl.col("end_reason") != EndReason.ERROR.value

    def over_ok(expr: pl.Expr) -> pl.Expr:
        return expr.filter(ok).sum() / ok.sum()

    out = latest.group_by(by).agg(
        pl.len().alias("n"),
        pl.col("agreed").filter(ok).sum().alias("deals"),
        deal_rate_expr(ok).alias("deal_rate"),
        over_ok(pl.col("seller_utility")).alias("mean_seller_utility"),
        over_ok(pl.col("buyer_utility")).alias("mean_buyer_utility"),
        over_ok(pl.col("rounds").cast(pl.Float64)).alias("mean_rounds"),
        invalid_per_move_expr(Role(by)).alias("invalid_rate"),
        (~ok).sum().alias("errors"),
        (pl.col(f"{by}_prompt_tokens") + pl.col(f"{by}_completion_tokens")).sum().alias("tokens"),
        pl.col(f"{by}_cost_usd").sum().alias("cost_usd"),
    )
    out = out.rename({by: "spec"}).with_columns(
        pl.when(pl.col(c).is_nan()).then(None).otherwise(pl.col(c)).alias(c)
        for c in ("mean_seller_utility", "mean_buyer_utility", "mean_rounds")
    )
    return out.select(pl.col(name).cast(dtype) for name, dtype in SUMMARY_SCHEMA.items()).sort("spec")


@dataclass(slots=True)
class _Totals:
    n: int = 0
    errors: int = 0
    deals: int = 0
    seller_utility: float = 0.0
    buyer_utility: float = 0.0
    rounds: int = 0
    invalid: int = 0
    moves: int = 0
    tokens: int = 0
    cost_usd: float = 0.0

    def add(self, other: _Totals, sign: int = 1) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + sign * getattr(other, f.name))

    def row(self, spec: str) -> dict[str, object]:
        good = self.n - self.errors

        def mean(total: float) -> float | None:
            return total / good if good else None

        return {
            "spec": spec,
            "n": self.n,
            "deals": self.deals,
            "deal_rate": deal_rate(self.deals, good),
            "mean_seller_utility": mean(self.seller_utility),
            "mean_buyer_utility": mean(self.buyer_utility),
            "mean_rounds": mean(self.rounds),
            "invalid_rate": invalid_per_move(self.invalid, self.moves),
            "errors": self.errors,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
        }


def _contribution(result: NegotiationResult, role: Role) -> _Totals:
    o = result.outcome
    failed = o.end_reason is EndReason.ERROR
    usage = result.usage_seller if role is Role.SELLER else result.usage_buyer
    return _Totals(
        n=1,
        errors=int(failed),
        deals=int(o.agreed),
        seller_utility=0.0 if failed else o.seller_utility,
        buyer_utility=0.0 if failed else o.buyer_utility,
        rounds=0 if failed else o.rounds,
        invalid=invalid_moves(o, role),
        moves=moves(result, role),
        tokens=usage.prompt_tokens + usage.completion_tokens,
        cost_usd=usage.cost_usd,
    )


class RunningStats:
    """Summaries kept up to date from events: subscribe it to an :class:`EventBus` (it is callable).

    A later attempt of a negotiation replaces the earlier one, as in :func:`summarize`. Each event costs O(1).
    """

    def __init__(self) -> None:
        self._totals: dict[tuple[Role, str], _Totals] = {}
        self._seen: dict[str, tuple[str, str, _Totals, _Totals]] = {}

    def __call__(self, event: object) -> None:
        if isinstance(event, NegotiationEnded):
            self.add(event.job.negotiation_id, event.job.seller, event.job.buyer, event.result)

    def add(self, negotiation_id: str, seller: str, buyer: str, result: NegotiationResult) -> None:
        """Count one finished negotiation (replacing an earlier attempt of the same id)."""
        previous = self._seen.get(negotiation_id)
        if previous is not None:
            old_seller, old_buyer, s, b = previous
            self._total(Role.SELLER, old_seller).add(s, -1)
            self._total(Role.BUYER, old_buyer).add(b, -1)
        s, b = _contribution(result, Role.SELLER), _contribution(result, Role.BUYER)
        self._total(Role.SELLER, seller).add(s)
        self._total(Role.BUYER, buyer).add(b)
        self._seen[negotiation_id] = (seller, buyer, s, b)

    def _total(self, role: Role, spec: str) -> _Totals:
        return self._totals.setdefault((role, spec), _Totals())

    @property
    def count(self) -> int:
        """Negotiations counted so far."""
        return len(self._seen)

    def frame(self, by: Side = "seller") -> pl.DataFrame:
        """The same table as :func:`summarize` gives for the negotiations seen so far."""
        role = Role(by)
        rows = [t.row(spec) for (r, spec), t in sorted(self._totals.items()) if r is role and t.n]
        return pl.DataFrame(rows, schema=SUMMARY_SCHEMA, orient="row")
