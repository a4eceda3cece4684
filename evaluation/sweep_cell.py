"""One cell of a sweep and its directory: train it (unless done), evaluate it, and leave its result there.

Layout of ``cells/NAME/``: ``train.json`` (what training registered, with its settings), ``train/`` (the training
run), ``eval/`` (an evaluation run directory), and once the cell is finished ``rows.parquet`` (its study rows)
with ``done.json`` (the settings they were made with). A failed attempt leaves ``error.log`` (summary line, then
the traceback); a cell handed to a launcher has ``job.json`` (see :mod:`.launchers`).

:func:`run_cell` is the whole life of a cell, whoever runs it: the sequential runner calls it in the sweep's own
process, a launcher job calls it through :func:`run_cell_job`. It holds the cell directory's lock, so two jobs
never work on one cell, while the sweep process holds the study directory's.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from nego.market.locks import DirectoryBusy, exclusive_run
from nego.market.marketplace import FactorySource

from .config import EvalConfig, SweepConfig
from .launchers import ERROR_LOG, write_error_log
from .runner import evaluate
from .suites import load_suite

ROWS = "rows.parquet"
DONE = "done.json"
TRAIN_MARKER = "train.json"


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


def cell_directory(config: SweepConfig, cell: Cell) -> Path:
    return config.out / "cells" / cell.name


def cell_settings(config: SweepConfig) -> dict[str, Any]:
    """What a finished cell's rows depend on, as it reads back from JSON: a cell finished under other settings is
    not finished for this sweep."""
    settings = {
        "train_args": dict(config.train_args),
        "suite_hash": load_suite(config.suite).content_hash(),
        "buyers": list(config.buyers),
        "diagnostic": config.diagnostic,
        "resamples": config.resamples,
    }
    return json.loads(json.dumps(settings))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def trained_before(directory: Path, train_args: dict[str, Any]) -> TrainedArms | None:
    """The arms a finished training of this cell registered, or None; a cell trained with other settings is refused,
    never reused."""
    marker = directory / TRAIN_MARKER
    if not marker.is_file():
        return None
    data = json.loads(marker.read_text())
    if data.get("train_args") != train_args:
        raise ValueError(
            f"{marker} was trained with settings {data.get('train_args')}, this sweep asks for {train_args}: "
            "use another sweep directory (out) or delete that cell to retrain it"
        )
    return TrainedArms(data["base"], data["trained"])


def finished_rows(directory: Path, settings: dict[str, Any]) -> pl.DataFrame | None:
    """The study rows of a cell finished under ``settings``, or None."""
    done, rows = directory / DONE, directory / ROWS
    if not (done.is_file() and rows.is_file()):
        return None
    if json.loads(done.read_text()).get("settings") != settings:
        return None
    return pl.read_parquet(rows)


def _train(cell: Cell, directory: Path, config: SweepConfig, train_fn: TrainFn, echo) -> TrainedArms:
    settings = json.loads(json.dumps(dict(config.train_args)))  # as it reads back from the marker
    arms = trained_before(directory, settings)
    if arms is not None:
        echo(f"{cell.name}: trained before ({arms.trained}), skipping training")
        return arms
    echo(f"{cell.name}: training")
    arms = train_fn(cell, directory / "train", dict(config.train_args))
    directory.mkdir(parents=True, exist_ok=True)
    marker = {"base": arms.base, "trained": arms.trained, "train_args": settings}
    _write_atomic(directory / TRAIN_MARKER, json.dumps(marker) + "\n")
    return arms


def _evaluate(cell: Cell, directory: Path, arms: TrainedArms, config: SweepConfig, factories, echo) -> pl.DataFrame:
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


def run_cell(
    cell: Cell, config: SweepConfig, train_fn: TrainFn, factories: FactorySource | None, echo: Callable[[str], None]
) -> pl.DataFrame:
    """Train (unless done) and evaluate one cell under its directory's lock, and write its study rows there;
    returns them. A failure leaves ``error.log`` in the cell directory and is raised."""
    directory = cell_directory(config, cell)
    settings = cell_settings(config)
    with exclusive_run(directory, f"nego sweep cell {cell.name} on {socket.gethostname()}"):
        rows = finished_rows(directory, settings)
        if rows is not None:  # another job finished it meanwhile
            echo(f"{cell.name}: finished before")
            return rows
        (directory / ERROR_LOG).unlink(missing_ok=True)
        try:
            arms = _train(cell, directory, config, train_fn, echo)
            rows = _evaluate(cell, directory, arms, config, factories, echo)
        except Exception as e:
            write_error_log(directory, e)
            raise
        tmp = directory / f"{ROWS}.tmp"
        rows.write_parquet(tmp)
        os.replace(tmp, directory / ROWS)
        _write_atomic(directory / DONE, json.dumps({"cell": cell.name, "settings": settings}, indent=1) + "\n")
    return rows


def run_cell_job(cell: Cell, config: SweepConfig, train_fn: TrainFn, factories: FactorySource | None) -> str:
    """The function a launcher job runs: :func:`run_cell`, reporting through the cell directory. A failure is
    written to ``error.log`` and the job's stderr and returned as text rather than raised, so that every launcher,
    the in-process debug one too, treats a failed cell the same way."""
    try:
        run_cell(cell, config, train_fn, factories, echo=lambda line: print(line, flush=True))
    except DirectoryBusy as e:  # another job holds the cell
        print(f"{cell.name}: not run: {e}", file=sys.stderr, flush=True)
        return f"not run: {e}"
    except Exception as e:
        traceback.print_exc()
        return f"failed: {type(e).__name__}: {e}"
    return "finished"
