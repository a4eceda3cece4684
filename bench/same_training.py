"""Do two training runs agree? Step rewards and losses, registered dev results and transcripts, side by side.

Used to show that a change to the training code left its behaviour alone: train once before and once after with the
same seed and thread count (each with its own ``NEGO_HOME``), then compare::

    NEGO_HOME=A nego train --threads 1 --out A/run --no-live      # before the change
    NEGO_HOME=B nego train --threads 1 --out B/run --no-live      # after
    python bench/same_training.py A/run B/run --homes A B

Timing columns (seconds, tokens per second) are left out; everything else must be equal, value for value.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polars as pl

STEP_COLUMNS = ("step", "reward_mean", "reward_std", "loss", "entropy", "grad_norm", "deal_rate", "invalid_rate")


def step_rows(run: Path) -> pl.DataFrame:
    log = pl.read_parquet(run / "train_log.parquet")
    return log.filter(pl.col("reward_mean").is_not_null()).select(STEP_COLUMNS).sort("step")


def negotiations(run: Path) -> pl.DataFrame:
    rows = pl.read_parquet(run / "transcripts" / "negotiations" / "*.parquet")
    timing = [c for c in rows.columns if c.endswith("_s") or c == "run_id"]
    return rows.drop(timing).sort("negotiation_id", "attempt")


def dev_records(home: Path) -> dict[str, object]:
    models = json.loads((home / "models.json").read_text())["models"]
    return {name: entry["eval"].get("dev") for name, entry in sorted(models.items())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--homes", nargs=2, type=Path, help="the two NEGO_HOME folders, to compare registered dev results")
    args = p.parse_args(argv)
    same = True
    sa, sb = step_rows(args.a), step_rows(args.b)
    ok = sa.equals(sb)
    same &= ok
    print(f"GRPO steps: {sa.height} and {sb.height}; rewards, losses, entropy, rates step for step: {_say(ok)}")
    if args.homes:
        ok = dev_records(args.homes[0]) == dev_records(args.homes[1])
        same &= ok
        print(f"registered models' dev results: {_say(ok)}")
    na, nb = negotiations(args.a), negotiations(args.b)
    ok = na.equals(nb)
    same &= ok
    print(f"transcripts: {na.height} and {nb.height} negotiations, every non-timing column: {_say(ok)}")
    return 0 if same else 1


def _say(ok: bool) -> str:
    return "identical" if ok else "DIFFERENT"


if __name__ == "__main__":
    sys.exit(main())
