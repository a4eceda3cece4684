"""The shared rates: each definition on hand-built negotiations, and every table, log and report computing the same
number as the definition on the same results."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from nego.evaluation.metrics import compute_metrics, summarise
from nego.market.marketplace import Job, run_jobs, scenario_hash
from nego.market.rates import (
    deal_rate,
    deal_rate_expr,
    deal_rate_of,
    invalid_per_move,
    invalid_per_move_expr,
    invalid_per_move_of,
    invalid_per_negotiation,
    invalid_per_negotiation_of,
    moves,
)
from nego.market.summary import RunningStats, summarize
from nego.market.transcript_rows import NEGOTIATIONS_SCHEMA, negotiation_row
from nego.market.transcripts import TranscriptWriter, read_negotiations
from nego.market.types import Action, EndReason, NegotiationResult, Observation, Outcome, Turn
from nego.scenarios.scenario import Role
from nego.training.evaluate import BuyerResult
from nego.training.rollout import RolloutStats
from nego.training.runner import Rollout, TokenTrace

from ..conftest import make_widget_scenario
from .fakes import Factory

SC = make_widget_scenario(max_rounds=4)
PACKAGE = Path(__file__).resolve().parents[2]


def played(end: EndReason, seller: str, buyer: str = "") -> NegotiationResult:
    """A negotiation by hand: ``seller``/``buyer`` spell each side's moves in order, ``v`` valid and ``x`` invalid
    (sides alternate by round; only the counts matter to the rates)."""
    turns = []
    for role, moves_ in ((Role.SELLER, seller), (Role.BUYER, buyer)):
        for k, move in enumerate(moves_):
            action = Action.accept() if move == "v" else Action.invalid("?", "not an action")
            turns.append(Turn(len(turns), k + 1, role, 0, action, valid=move == "v"))
    outcome = Outcome(
        end_reason=end,
        agreement=None,
        seller_utility=0.5,
        buyer_utility=0.5,
        rounds=max(len(seller), len(buyer), 1),
        turns=len(turns),
        invalid_seller=seller.count("x"),
        invalid_buyer=buyer.count("x"),
    )
    return NegotiationResult(SC.id, 0, outcome, tuple(turns))


DEAL, DEADLINE, WALK = EndReason.AGREEMENT, EndReason.DEADLINE, EndReason.WALK_AWAY


def test_deal_rate_is_deals_per_negotiation():
    assert deal_rate(3, 4) == 0.75
    assert deal_rate(0, 5) == 0.0
    assert deal_rate(0, 0) is None
    with_deals = [played(DEAL, "vv"), played(DEADLINE, "vvv"), played(DEAL, "xv"), played(WALK, "v")]
    assert deal_rate_of(r.outcome for r in with_deals) == 0.5
    assert deal_rate_of(r.outcome for r in with_deals[1::2]) == 0.0
    assert deal_rate_of([]) is None


def test_invalid_per_move_and_per_negotiation_have_different_denominators():
    # 3 invalid seller moves: over 2 negotiations, and over 2 + 4 = 6 seller moves (the retries are moves)
    results = [played(DEAL, "xv", "v"), played(DEADLINE, "xxvv", "vvx")]
    assert [moves(r) for r in results] == [2, 4]
    assert invalid_per_move_of(results) == 0.5
    assert invalid_per_negotiation_of(r.outcome for r in results) == 1.5
    assert invalid_per_move_of(results, Role.BUYER) == 0.25
    assert invalid_per_negotiation_of((r.outcome for r in results), Role.BUYER) == 0.5
    assert invalid_per_move(3, 6) == 0.5 and invalid_per_negotiation(3, 2) == 1.5


def test_no_moves_or_no_negotiations_give_no_rate():
    walked_out = [played(WALK, "", "v")]  # the buyer opened and walked away: the seller never moved
    assert invalid_per_move_of(walked_out) is None and invalid_per_move(0, 0) is None
    assert invalid_per_negotiation_of(r.outcome for r in walked_out) == 0.0
    assert invalid_per_move_of([]) is None
    assert invalid_per_negotiation_of([]) is None and invalid_per_negotiation(0, 0) is None


def _table(results: list[NegotiationResult]) -> pl.DataFrame:
    rows = [negotiation_row(Job(SC, "s", "b", i, f"n{i}"), 0, r, 0.0) for i, r in enumerate(results)]
    return pl.DataFrame(rows, schema=NEGOTIATIONS_SCHEMA)


def test_the_polars_forms_are_the_plain_forms():
    results = [played(DEAL, "xv", "v"), played(DEADLINE, "xxvv", "vvx"), played(WALK, "v", "x")]
    table = _table(results)
    got = table.select(
        deal_rate_expr().alias("deal"),
        deal_rate_expr(pl.col("end_reason") == DEAL.value).alias("deal_of_deals"),
        invalid_per_move_expr().alias("seller"),
        invalid_per_move_expr(Role.BUYER).alias("buyer"),
    ).row(0, named=True)
    assert got["deal"] == deal_rate_of(r.outcome for r in results) == pytest.approx(1 / 3)
    assert got["deal_of_deals"] == 1.0
    assert got["seller"] == invalid_per_move_of(results) == 3 / 7
    assert got["buyer"] == invalid_per_move_of(results, Role.BUYER) == 2 / 5
    empty = _table([played(WALK, "", "v")]).select(invalid_per_move_expr(), deal_rate_expr(pl.lit(False)))
    assert empty.row(0) == (None, None)  # null, as the plain forms give None


class _Leave:
    async def act(self, obs: Observation) -> Action:
        return Action.walk_away("not today")


@dataclass
class Leaver:
    """A buyer that walks away at its first move: a no-deal after the seller's opening (and its retry)."""

    spec: str = "leaver"
    kind: str = "rule"

    def __call__(self, role: Role, seed: int) -> _Leave:
        return _Leave()


def test_every_table_log_and_report_computes_the_shared_definition(tmp_path):
    """The simulate summary (table and live), the training log's rollout statistics, the dev evaluation and the
    evaluation metrics, on the same negotiations of a seller whose first move is always invalid."""
    factories = {"sloppy": Factory("sloppy", invalid_first=True), "b": Factory("b"), "leaver": Leaver()}
    jobs = [Job(SC, "sloppy", "b", i) for i in range(5)] + [Job(SC, "sloppy", "leaver", i) for i in range(5, 8)]
    live = RunningStats()
    results = run_jobs(factories, jobs, writer=TranscriptWriter(tmp_path))
    for job, r in zip(jobs, results, strict=True):
        live.add(job.negotiation_id, job.seller, job.buyer, r)
    outcomes = [r.outcome for r in results]
    deals, per_move = deal_rate_of(outcomes), invalid_per_move_of(results)
    assert deals == 5 / 8 and per_move is not None and 0 < per_move < 1
    assert invalid_per_negotiation_of(outcomes) == 1.0

    table = read_negotiations(tmp_path)
    for summary in (summarize(table), live.frame("seller")):
        row = summary.row(0, named=True)
        assert (row["deal_rate"], row["invalid_rate"]) == (deals, per_move)

    trace = TokenTrace((1,), (2, 3), (1, 0), (0.0, 0.0))
    stats = RolloutStats()
    stats.record([Rollout(j, r, trace, 0.0) for j, r in zip(jobs, results, strict=True)], seconds=1.0)
    assert (stats.deal_rate, stats.invalid_rate) == (deals, per_move)

    dev = BuyerResult(
        "mixed",
        tuple(o.seller_utility for o in outcomes),
        tuple(o.agreed for o in outcomes),
        tuple(o.invalid_seller for o in outcomes),
    )
    assert (dev.deal_rate, dev.invalid_per_episode) == (deals, invalid_per_negotiation_of(outcomes))

    metrics = compute_metrics(table, {scenario_hash(SC): SC})
    by_id = {j.negotiation_id: r for j, r in zip(jobs, results, strict=True)}
    assert metrics["invalid_rate"].to_list() == [invalid_per_move_of([by_id[n]]) for n in metrics["negotiation_id"]]
    means = summarise(metrics, by=("arm",)).row(0, named=True)
    assert means["deal"] == deals
    # the evaluation's invalid_rate weighs negotiations alike: not the pooled rate when they differ in length
    assert means["invalid_rate"] == pytest.approx(sum(metrics["invalid_rate"]) / 8)
    assert means["invalid_rate"] != pytest.approx(per_move)


RATE_NAMES = {"agreed", "deal", "deals", "invalid"}
NOT_A_RATE_DEFINITION = {
    # the mean over a family's GRPO groups of each group's deal rate (each computed with the shared definition)
    ("bench/rollout_groups.py", "pl.col('deal').mean()"),
}


def _counts_a_rate(node: ast.AST) -> bool:
    """Whether ``node`` mentions a deal or invalid count: a name, attribute or column named like one."""
    for sub in ast.walk(node):
        name = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else None
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            name = sub.value
        if name is not None and (name in RATE_NAMES or name.startswith("invalid_")):
            return True
    return False


def _rate_computations(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every division of a deal or invalid count and every mean over one in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        divides = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _counts_a_rate(node.left)
        averages = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "mean"
            and any(_counts_a_rate(n) for n in (node.func.value, *node.args))
        )
        if divides or averages:
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_no_module_outside_rates_divides_deals_or_invalid_moves_by_a_count():
    folders = ("market", "training", "evaluation", "cli", "agents", "scenarios", "bench")
    paths = [
        p
        for folder in folders
        for p in sorted((PACKAGE / folder).rglob("*.py"))
        if not any(part.startswith(".") for part in p.relative_to(PACKAGE).parts)  # e.g. bench/.venv-negmas
    ]
    assert PACKAGE / "market" / "rates.py" in paths and len(paths) > 50
    found = [
        f"{name}:{line}: {expr}"
        for p in paths
        if (name := str(p.relative_to(PACKAGE))) != "market/rates.py"
        for line, expr in _rate_computations(p.read_text())
        if (name, expr) not in NOT_A_RATE_DEFINITION
    ]
    assert not found, "\n".join(found)


def test_the_rate_check_finds_a_rate_computed_by_hand():
    source = (
        "a = sum(o.agreed for o in xs) / len(xs)\n"
        "b = df.select(pl.col('agreed').cast(pl.Float64).mean())\n"
        "c = (pl.col(f'invalid_{side}').sum() / pl.col('turns_seller').sum())\n"
        "d = np.mean([r.outcome.invalid_seller for r in rs])\n"
        "e = mine.deals / mine.n\n"
        "f = utility / n + deal_rate(deals, n)\n"
    )
    assert [line for line, _ in _rate_computations(source)] == [1, 2, 3, 4, 5]
