"""Per-negotiation metrics computed from transcripts and the exact analysis of each scenario, and their means.

Every metric is a column of one row per negotiation, so any breakdown (per arm, per buyer, per category) is a
group-by. Definitions (``u_s``/``u_b`` seller/buyer utility, ``r_s``/``r_b`` reservations):

- ``score``: the seller's utility of the outcome; its reservation value without a deal.
- ``surplus_share``: ``(u_s - r_s) / (max u_s in the zone of agreement - r_s)``; 0 without a deal, negative for an
  agreement below the seller's reservation, null when the scenario has no zone of agreement.
- ``pareto_distance``: Euclidean distance in utility space from the agreement to the nearest Pareto-optimal
  outcome; null without a deal.
- ``nash``: ``(u_s - r_s)(u_b - r_b)`` over its maximum in the scenario (the Nash point); 0 without a deal or for
  an agreement below either side's reservation; null when the scenario has no zone of agreement.
- ``optimality_gap``: best-response value against the buyer minus the score (see
  :mod:`nego.evaluation.best_response`); null where the buyer is not a deterministic rule-based agent.
- ``rounds_to_agreement`` (null without a deal), ``invalid_rate`` (the seller's invalid moves per seller move in
  this negotiation, :func:`~nego.market.rates.invalid_per_move`; 0 if the seller made no move), ``ir_violation``
  (an agreement worth less than the seller's own reservation), ``tokens`` and ``cost_usd`` (the seller's).

The mean of ``deal`` over negotiations is the deal rate (:func:`~nego.market.rates.deal_rate`: deals per
negotiation). The mean of ``invalid_rate`` weighs every negotiation alike: it is the mean over negotiations of each
one's invalid moves per move, not the pooled invalid moves per move of ``nego simulate``'s tables and the training log,
where a long negotiation weighs more.

A negotiation that ended in an error (a backend that kept failing) is not a no-deal: ``error`` is true and every
outcome metric is null, so means and rates leave it out; its tokens and cost still count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl
from nego.market.rates import invalid_per_move
from nego.scenarios.analysis import ScenarioAnalysis, analyse
from nego.scenarios.scenario import Role, Scenario

IR_TOLERANCE = 1e-9
"""Utilities this close below the reservation are rounding, not a violation."""

METRIC_COLUMNS = (
    "score",
    "deal",
    "surplus_share",
    "pareto_distance",
    "nash",
    "optimality_gap",
    "rounds_to_agreement",
    "invalid_rate",
    "ir_violation",
    "tokens",
    "cost_usd",
)

KEY_COLUMNS = ("negotiation_id", "arm", "buyer", "scenario_id", "scenario_hash", "category", "opener", "seed")


@dataclass(frozen=True, slots=True)
class ZoneFacts:
    """What the metrics need to know about one scenario, taken from its exact analysis."""

    reservation_seller: float
    reservation_buyer: float
    frontier: np.ndarray
    seller_best_in_zone: float | None
    nash_product: float

    @staticmethod
    def of(analysis: ScenarioAnalysis) -> ZoneFacts:
        r_s, r_b = analysis.reservations
        front = analysis.pareto_utilities
        best: float | None = None
        if analysis.zopa:
            in_zone = front[(front[:, 0] >= r_s) & (front[:, 1] >= r_b)]
            best = float(in_zone[:, 0].max()) if in_zone.size else None
        return ZoneFacts(r_s, r_b, front, best, analysis.nash_product)


def surplus_share(facts: ZoneFacts, deal: bool, u_s: float) -> float | None:
    if facts.seller_best_in_zone is None:
        return None
    if not deal:
        return 0.0
    span = facts.seller_best_in_zone - facts.reservation_seller
    if span <= IR_TOLERANCE:
        # a zone of one seller utility level: any agreement in it takes the whole range
        return 1.0 if u_s >= facts.reservation_seller - IR_TOLERANCE else -1.0
    return (u_s - facts.reservation_seller) / span


def pareto_distance(facts: ZoneFacts, deal: bool, u_s: float, u_b: float) -> float | None:
    if not deal:
        return None
    front = facts.frontier
    return float(np.min(np.hypot(front[:, 0] - u_s, front[:, 1] - u_b)))


def normalised_nash(facts: ZoneFacts, deal: bool, u_s: float, u_b: float) -> float | None:
    if facts.seller_best_in_zone is None or facts.nash_product <= 0:
        return None
    if not deal:
        return 0.0
    gain_s, gain_b = u_s - facts.reservation_seller, u_b - facts.reservation_buyer
    if gain_s < 0 or gain_b < 0:
        return 0.0
    return min(1.0, gain_s * gain_b / facts.nash_product)


def zone_facts(scenarios: Mapping[str, Scenario]) -> dict[str, ZoneFacts]:
    """Analysis facts per key of ``scenarios``; variants that differ only in the opener share one analysis."""
    by_problem: dict[str, ZoneFacts] = {}
    out: dict[str, ZoneFacts] = {}
    for key, scenario in scenarios.items():
        problem = scenario.with_opener(Role.SELLER).content_hash()
        if problem not in by_problem:
            by_problem[problem] = ZoneFacts.of(analyse(scenario))
        out[key] = by_problem[problem]
    return out


def compute_metrics(
    negotiations: pl.DataFrame,
    scenarios: Mapping[str, Scenario],
    gaps: Mapping[str, float | None] | None = None,
) -> pl.DataFrame:
    """One metrics row per negotiation in ``negotiations`` (latest attempts from the transcripts).

    ``scenarios`` maps each ``scenario_hash`` in the table to its scenario; ``gaps`` maps negotiation ids to their
    optimality gap (missing ids get null).
    """
    missing = set(negotiations["scenario_hash"].unique()) - set(scenarios)
    if missing:
        raise KeyError(f"{len(missing)} scenario hash(es) in the transcripts are not in the suite, e.g. {min(missing)}")
    facts = zone_facts({h: scenarios[h] for h in negotiations["scenario_hash"].unique()})
    gaps = gaps or {}
    rows = []
    for r in negotiations.iter_rows(named=True):
        spent = {
            "tokens": (r["seller_prompt_tokens"] or 0) + (r["seller_completion_tokens"] or 0),
            "cost_usd": r["seller_cost_usd"] or 0.0,
        }
        if r["end_reason"] == "error":
            # an error is not a no-deal: its outcome metrics stay null so no mean counts it; what it cost is real
            rows.append({"negotiation_id": r["negotiation_id"], **spent, "error": True})
            continue
        f = facts[r["scenario_hash"]]
        deal, u_s, u_b = bool(r["agreed"]), float(r["seller_utility"]), float(r["buyer_utility"])
        invalid = invalid_per_move(r["invalid_seller"] or 0, r["turns_seller"] or 0)
        rows.append(
            {
                "negotiation_id": r["negotiation_id"],
                "score": u_s,
                "deal": deal,
                "surplus_share": surplus_share(f, deal, u_s),
                "pareto_distance": pareto_distance(f, deal, u_s, u_b),
                "nash": normalised_nash(f, deal, u_s, u_b),
                "optimality_gap": gaps.get(r["negotiation_id"]),
                "rounds_to_agreement": r["rounds"] if deal else None,
                "invalid_rate": 0.0 if invalid is None else invalid,  # no move, no invalid move
                "ir_violation": deal and u_s < f.reservation_seller - IR_TOLERANCE,
                **spent,
                "error": False,
            }
        )
    values = pl.DataFrame(rows, schema=METRICS_SCHEMA)
    keys = negotiations.select(
        "negotiation_id",
        pl.col("seller").alias("arm"),
        "buyer",
        "scenario_id",
        "scenario_hash",
        "category",
        pl.col("opener").cast(pl.String),
        "seed",
    )
    return keys.join(values, on="negotiation_id", how="left", maintain_order="left")


METRICS_SCHEMA = pl.Schema(
    {
        "negotiation_id": pl.String,
        "score": pl.Float64,
        "deal": pl.Boolean,
        "surplus_share": pl.Float64,
        "pareto_distance": pl.Float64,
        "nash": pl.Float64,
        "optimality_gap": pl.Float64,
        "rounds_to_agreement": pl.Int32,
        "invalid_rate": pl.Float64,
        "ir_violation": pl.Boolean,
        "tokens": pl.Int64,
        "cost_usd": pl.Float64,
        "error": pl.Boolean,
    }
)


def summarise(metrics: pl.DataFrame, by: tuple[str, ...] = ("arm", "buyer")) -> pl.DataFrame:
    """Means of every metric per group over the negotiations that did not end in an error (``n`` of them, over
    ``scenarios`` scenarios; rates for the boolean metrics), the error count, and the total tokens and cost."""
    ok = ~pl.col("error")
    aggs = [ok.sum().alias("n"), pl.col("scenario_id").filter(ok).n_unique().alias("scenarios")]
    for col in METRIC_COLUMNS:
        aggs.append(pl.col(col).cast(pl.Float64).mean().alias(col))
    aggs.append(pl.col("tokens").sum().alias("tokens_total"))
    aggs.append(pl.col("cost_usd").sum().alias("cost_total"))
    aggs.append(pl.col("error").sum().alias("errors"))
    return metrics.group_by(*by, maintain_order=True).agg(aggs)
