"""A study sweep: train every (model size, learning rate, seed) cell, evaluate each on the same suite, and
tabulate the RL gain over the base model per size, rate and buyer.

Layout under the sweep directory: ``cells/NAME/train.json`` (what training registered) and ``cells/NAME/eval/``
(an evaluation run directory), then ``study.parquet``, ``study.md`` and ``gain_vs_size.png``. A cell whose
training finished is not trained again; its evaluation resumes from its transcripts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from nego.market.locks import exclusive_run
from nego.market.marketplace import FactorySource

from .config import EvalConfig, SweepConfig
from .runner import evaluate
from .stats import holm
from .suites import load_suite


@dataclass(frozen=True, slots=True)
class Cell:
    """One point of the grid."""

    size: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        # repr, not a rounded format: two distinct rates must never share a directory or a registered model
        return f"sweep-{self.size}-lr{float(self.lr)!r}-s{self.seed}"


@dataclass(frozen=True, slots=True)
class TrainedArms:
    """The registered specs a training run produced: the base model and the RL-trained one."""

    base: str
    trained: str


TrainFn = Callable[[Cell, Path, dict[str, Any]], TrainedArms]
"""Trains one cell into a directory and returns the specs to evaluate."""


def train_with_nego(cell: Cell, directory: Path, settings: dict[str, Any]) -> TrainedArms:
    """Train a cell with ``nego.training`` (registers NAME and NAME-rl in the local model registry)."""
    from nego.training.config import TrainConfig
    from nego.training.grpo import train

    try:
        cfg = TrainConfig(model=cell.size, name=cell.name, lr=cell.lr, seed=cell.seed, out=str(directory), **settings)
    except TypeError as e:
        raise ValueError(f"[sweep.train] holds a setting nego train does not know: {e}") from e
    result = train(cfg, echo=lambda *_: None)
    return TrainedArms(result.base_name, result.rl_name)


def cells(config: SweepConfig) -> list[Cell]:
    return [Cell(size, lr, seed) for size in config.sizes for lr in config.learning_rates for seed in config.seeds]


def _trained(cell: Cell, directory: Path, config: SweepConfig, train_fn: TrainFn, echo) -> TrainedArms:
    marker = directory / "train.json"
    settings = json.loads(json.dumps(dict(config.train_args)))  # as it reads back from the marker
    if marker.is_file():
        data = json.loads(marker.read_text())
        if data.get("train_args") != settings:
            raise ValueError(
                f"{marker} was trained with settings {data.get('train_args')}, this sweep asks for {settings}: "
                "use another sweep directory (out) or delete that cell to retrain it"
            )
        echo(f"{cell.name}: trained before ({data['trained']}), skipping training")
        return TrainedArms(data["base"], data["trained"])
    echo(f"{cell.name}: training")
    arms = train_fn(cell, directory / "train", dict(config.train_args))
    directory.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps({"base": arms.base, "trained": arms.trained, "train_args": settings}) + "\n")
    tmp.replace(marker)
    return arms


def run_cell(cell: Cell, config: SweepConfig, train_fn: TrainFn, factories: FactorySource | None, echo) -> pl.DataFrame:
    """Train (unless done) and evaluate one cell; returns its comparison rows for the trained arm."""
    directory = config.out / "cells" / cell.name
    arms = _trained(cell, directory, config, train_fn, echo)
    eval_cfg = EvalConfig(
        sellers=(arms.base, arms.trained),
        out=directory / "eval",
        suite=config.suite,
        buyers=config.buyers,
        diagnostic=config.diagnostic,
        concurrency=config.concurrency,
        resamples=config.resamples,
    )
    result = evaluate(eval_cfg, factories)
    echo(f"{cell.name}: evaluated ({result.played} negotiations played now)")
    c = result.comparisons
    base = c.filter(pl.col("arm") == arms.base).select(
        "group", pl.col("score").alias("base_score"), pl.col("deal_rate").alias("base_deal_rate")
    )
    trained = c.filter(pl.col("arm") == arms.trained).drop("arm", "p_holm")
    return trained.join(base, on="group", how="left").with_columns(
        pl.lit(cell.size).alias("size"),
        pl.lit(cell.lr).alias("lr"),
        pl.lit(cell.seed).alias("seed"),
        pl.lit(arms.base).alias("base"),
        pl.lit(arms.trained).alias("trained"),
        pl.lit(",".join(result.trained_against_held_out.get(arms.trained, []))).alias("trained_against"),
    )


def run_sweep(
    config: SweepConfig,
    *,
    train_fn: TrainFn = train_with_nego,
    factories: FactorySource | None = None,
    echo: Callable[[str], None] = print,
) -> pl.DataFrame:
    """Run every cell and write the study table and plot; returns the table (one row per cell and buyer group)."""
    load_suite(config.suite)  # fail on a bad suite before training anything
    with exclusive_run(config.out, f"nego sweep (study {config.out})"):
        rows = [run_cell(cell, config, train_fn, factories, echo) for cell in cells(config)]
        return _write_study(pl.concat(rows, how="diagonal_relaxed"), config)


def _write_study(study: pl.DataFrame, config: SweepConfig) -> pl.DataFrame:
    # Holm across every cell within each buyer group: the study asks one question per cell
    adjusted = []
    for group in study["group"].unique(maintain_order=True):
        part = study.filter(pl.col("group") == group)
        tested = [p for p in part["p_value"].to_list() if p is not None]  # a cell without pairs has no test
        holm_ps = iter(holm(tested))
        p_holm = [None if p is None else next(holm_ps) for p in part["p_value"].to_list()]
        adjusted.append(part.with_columns(pl.Series("p_holm", p_holm, dtype=pl.Float64)))
    study = pl.concat(adjusted).select(
        "size",
        "lr",
        "seed",
        "group",
        "base",
        "trained",
        "n",
        "clusters",
        "base_score",
        "score",
        "gain",
        "gain_low",
        "gain_high",
        "p_value",
        "p_holm",
        "base_deal_rate",
        "deal_rate",
        "trained_against",
    )
    study.write_parquet(config.out / "study.parquet")
    write_study_report(study, config)
    return study


def _num(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def write_study_report(study: pl.DataFrame, config: SweepConfig) -> Path:
    """``study.md`` (gain over base per size, rate and buyer) and ``gain_vs_size.png``."""
    from .report import format_interval, format_p, pyplot

    suite = load_suite(config.suite)
    lines = [
        "# Sweep: RL gain over the base model",
        "",
        f"- suite **{suite.name}**, content hash `{suite.content_hash()}`; sizes {list(config.sizes)}, learning rates "
        f"{list(config.learning_rates)}, seeds {list(config.seeds)}",
        "- gain = paired mean difference (trained - base) on identical negotiations, 95% cluster-bootstrap interval; "
        "p from a cluster sign-flip test, Holm across cells within each buyer group",
        *(
            f"- **not held out:** {r['trained']} was trained against {r['trained_against']}, which this study holds out"
            for r in study.unique("trained", maintain_order=True).iter_rows(named=True)
            if r.get("trained_against")
        ),
        "",
        "| size | lr | seed | buyers | n | base | trained | gain [95% CI] | p | p (Holm) | deal rate base / trained |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for r in study.iter_rows(named=True):
        lines.append(
            f"| {r['size']} | {r['lr']!r} | {r['seed']} | {r['group']} | {r['n']} | {_num(r['base_score'], '.3f')} "
            f"| {r['score']:.3f} | {format_interval(r['gain'], r['gain_low'], r['gain_high'], signed=True)} "
            f"| {format_p(r['p_value'])} | {format_p(r['p_holm'])} "
            f"| {_num(r['base_deal_rate'], '.2f')} / {r['deal_rate']:.2f} |"
        )
    lines += ["", "![gain against size](gain_vs_size.png)", ""]
    path = config.out / "study.md"
    path.write_text("\n".join(lines))
    plt = pyplot()
    suite_rows = study.filter(pl.col("group") == "suite")
    sizes = list(config.sizes)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.axhline(0.0, color="grey", lw=0.8)
    for k, lr in enumerate(config.learning_rates):
        part = suite_rows.filter(pl.col("lr") == lr)
        xs = [sizes.index(s) + (k - (len(config.learning_rates) - 1) / 2) * 0.08 for s in part["size"]]
        err = [part["gain"] - part["gain_low"], part["gain_high"] - part["gain"]]
        ax.errorbar(xs, part["gain"], yerr=err, fmt="o-", capsize=3, label=f"lr {lr:g}")
    ax.set_xticks(range(len(sizes)), sizes)
    ax.set_xlabel("model size")
    ax.set_ylabel("gain over base (suite)")
    ax.set_title("RL gain against size, per learning rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(config.out / "gain_vs_size.png", dpi=110)
    plt.close(fig)
    return path
