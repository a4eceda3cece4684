"""The seller's moves in a training run's dev evaluations, read from the run's transcripts: how many were invalid,
where, and why.

For each run directory given and each dev evaluation in it (the ``dev`` arm, by step): negotiations, seller
attempts, invalid attempts and their share of the seller's moves, deals, mean seller utility, the scenarios with the
most invalid attempts and the commonest reasons (the parser's or the protocol's feedback without its values). Only
the dev split is read: a training run plays nothing else.

    python bench/dev_moves.py $NEGO_HOME/runs/smollm2-bc $NEGO_HOME/runs/OTHER
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def reason(feedback: str) -> str:
    """The kind of mistake a feedback names (``price must be between 1 and 9; got 12`` -> ``price must be ...``)."""
    head = feedback.split(";")[0]
    match = re.match(r"(\w+) must ", head)
    if match:
        return f"{match.group(1)}: a value out of range, off its grid or not an option"
    return re.sub(r"\d+(\.\d+)?", "N", head)[:80]


def report(run_dir: Path) -> list[str]:
    import polars as pl
    from nego.market.rates import deal_rate_expr, invalid_per_move
    from nego.training.evaluate import DEV_ARM

    negs, seller = seller_moves(run_dir / "transcripts", pl.col("arm") == DEV_ARM, "step")
    if negs.is_empty():
        return [f"{run_dir.name}: no dev evaluation in its transcripts"]
    lines = [f"{run_dir.name}"]
    for (step,), part in sorted(seller.group_by("step"), key=lambda g: g[0][0]):
        played = negs.filter(pl.col("step") == step)
        invalid = part.filter(~pl.col("valid"))
        summary = played.select(deal_rate_expr().alias("deals"), pl.col("seller_utility").mean().alias("u"))
        share = invalid_per_move(invalid.height, part.height)
        lines.append(
            f"  dev step {step}: {played.height} negotiations, seller attempts {part.height}, invalid "
            f"{invalid.height} ({share:.1%}), deal rate {summary['deals'][0]:.2f}, mean seller utility "
            f"{summary['u'][0]:.3f}"
        )
        lines += where_and_why(invalid)
    return lines


def seller_moves(root: Path, which, by: str):
    """(the negotiations of a transcript folder that ``which`` selects, the seller's moves in them with their
    scenario and the column ``by``)."""
    import polars as pl

    negs = pl.read_parquet(root / "negotiations" / "*.parquet").filter(which)
    turns = pl.read_parquet(root / "turns" / "*.parquet", columns=["negotiation_id", "role", "valid", "feedback"])
    moves = turns.filter(pl.col("role") == "seller").join(
        negs.select("negotiation_id", by, "scenario_id"), on="negotiation_id"
    )
    return negs, moves


def where_and_why(invalid) -> list[str]:
    """The four scenarios with the most invalid moves and the four commonest reasons, of a table of invalid seller
    moves (columns ``scenario_id`` and ``feedback``)."""
    import polars as pl

    lines = []
    for sid, k in invalid.group_by("scenario_id").len().sort("len", descending=True).head(4).iter_rows():
        lines.append(f"      {k:4d} invalid in {sid}")
    reasons = invalid.select(pl.col("feedback").fill_null("").map_elements(reason, return_dtype=pl.String))
    for text, k in reasons.to_series().value_counts(sort=True).head(4).iter_rows():
        lines.append(f"      {k:4d}  {text}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run directories ($NEGO_HOME/runs/NAME)")
    args = parser.parse_args()
    print(f"# python bench/{Path(__file__).name} " + " ".join(Path(r).name for r in args.runs))
    for run in args.runs:
        print("\n".join(report(Path(run))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
