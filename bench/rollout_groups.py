"""What each buyer family taught a training run: its GRPO groups per family and phase, read from the run's transcripts.

    python bench/rollout_groups.py $NEGO_HOME/runs/tiny            # phases of 40 steps
    python bench/rollout_groups.py $NEGO_HOME/runs/tiny --phase 20

For every family in the training pool and every phase of steps: how many groups it had, the share of groups whose
negotiations all earned the same reward (no learning signal), the rollouts' deal rate and their mean reward. A family
whose deal rate falls while its groups still differ in reward is one the policy is being pulled away from by the
others, not one it has stopped hearing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl
from nego.market.rates import deal_rate_expr
from nego.market.transcripts import read_negotiations


def groups_by_family(run_dir: Path, phase: int) -> pl.DataFrame:
    df = read_negotiations(run_dir / "transcripts", latest=True).filter(
        pl.col("arm") == "train", pl.col("step").is_not_null()
    )
    per_group = df.group_by("step", "group").agg(
        family=pl.col("buyer").first().str.split(":").list.first(),
        spread=pl.col("reward").max() - pl.col("reward").min(),
        deal=deal_rate_expr(),
        reward=pl.col("reward").mean(),
    )
    return (
        per_group.with_columns(first_step=(pl.col("step") // phase) * phase)
        .group_by("family", "first_step")
        .agg(
            groups=pl.len(),
            identical=(pl.col("spread") < 1e-9).mean(),
            deal_rate=pl.col("deal").mean(),
            reward=pl.col("reward").mean(),
        )
        .sort("family", "first_step")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a nego train run directory (with transcripts/)")
    parser.add_argument("--phase", type=int, default=40, help="steps per phase")
    args = parser.parse_args()
    table = groups_by_family(args.run_dir, args.phase)
    print(f"{args.run_dir.name}: training groups per buyer family, phases of {args.phase} steps")
    print("| family | steps | groups | identical rewards | deal rate | mean reward |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in table.iter_rows(named=True):
        steps = f"{r['first_step']}-{r['first_step'] + args.phase - 1}"
        print(
            f"| {r['family']} | {steps} | {r['groups']} | {r['identical']:.2f} | {r['deal_rate']:.2f} "
            f"| {r['reward']:.3f} |"
        )


if __name__ == "__main__":
    main()
