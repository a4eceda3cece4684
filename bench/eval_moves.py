"""The seller's moves in an evaluation run, read from its transcripts: per seller arm and buyer, how many moves were
invalid, in which scenarios, why, and how the negotiations ended.

The evaluation counterpart of ``bench/dev_moves.py`` (which reads a training run's dev evaluations): give it the
``--out`` folder of a ``nego eval`` and the arms to read. Reading an evaluation of the held-out suite is a held-out
read: declare what it is for before running it.

    python bench/eval_moves.py runs/eval/eval-192 --sellers smollm2-bc,smollm2-bc-rl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dev_moves import seller_moves, where_and_why


def report(eval_dir: Path, seller: str) -> list[str]:
    import polars as pl
    from nego.market.rates import invalid_per_move

    negs, moves = seller_moves(eval_dir / "transcripts", pl.col("seller") == seller, "buyer")
    if negs.is_empty():
        return [f"{seller}: not in this evaluation"]
    lines = [f"{seller}: {negs.height} negotiations"]
    buyers = sorted(negs["buyer"].unique())
    parts = [("both buyers", moves, negs)]
    parts += [(b, moves.filter(pl.col("buyer") == b), negs.filter(pl.col("buyer") == b)) for b in buyers]
    for name, part, played in parts:
        bad = part.filter(~pl.col("valid")).height
        ends = played.group_by("end_reason").len().sort("len", descending=True)
        ended = ", ".join(f"{r} {k}" for r, k in ends.iter_rows())
        lines.append(
            f"  {name}: seller moves {part.height}, invalid {bad} ({invalid_per_move(bad, part.height):.1%}); "
            f"ended: {ended}"
        )
    return lines + where_and_why(moves.filter(~pl.col("valid")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("eval_dir", help="the --out folder of a nego eval")
    parser.add_argument("--sellers", required=True, help="seller arms to read, comma-separated")
    args = parser.parse_args()
    print(f"# python bench/{Path(__file__).name} EVAL_DIR --sellers {args.sellers}")
    for seller in args.sellers.split(","):
        print("\n".join(report(Path(args.eval_dir), seller)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
