"""A study sweep: train every (model size, learning rate, seed) cell, evaluate each on the same suite, and
tabulate the RL gain over the base model per size, rate and buyer.

Layout under the sweep directory: ``cells/NAME/`` (one per cell, see :mod:`.sweep_cell`), ``jobs/`` (launcher
scripts and logs), then ``study.parquet``, ``study.md`` and ``gain_vs_size.png``. The cells run one after another in
this process (launcher ``local``, the default) or as one submitit job each (:mod:`.launchers`); either way a
finished cell is collected, not run again, a cell whose training finished is not trained again (its evaluation
resumes from its transcripts), and the study is written from the cell directories once every cell is finished.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from nego.market.locks import exclusive_run
from nego.market.marketplace import FactorySource

from . import launchers
from .config import SweepConfig
from .stats import holm
from .suites import load_suite
from .sweep_cell import (
    ERROR_LOG,
    Cell,
    TrainedArms,
    TrainFn,
    cell_directory,
    cell_settings,
    finished_rows,
    run_cell,
    run_cell_job,
    trained_before,
)

__all__ = ["Cell", "CellReport", "SweepIncomplete", "TrainFn", "TrainedArms", "cells", "run_sweep", "train_with_nego"]


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


@dataclass(frozen=True, slots=True)
class CellReport:
    """A cell that is not finished: what happened to it and where to look."""

    cell: str
    detail: str
    log: str | None = None

    def line(self) -> str:
        return f"{self.cell}: {self.detail}" + (f" (log: {self.log})" if self.log else "")


class SweepIncomplete(RuntimeError):
    """Some cells are not finished (failed, or still queued or running), so the study was not written. The
    finished cells stay in their directories; a rerun collects them and runs only the others."""

    def __init__(self, finished: int, total: int, failed: Sequence[CellReport], active: Sequence[CellReport]) -> None:
        self.finished, self.total = finished, total
        self.failed, self.active = tuple(failed), tuple(active)
        lines = [f"{finished} of {total} cells finished; the study is written once every cell is."]
        lines += [f"failed: {r.line()}" for r in self.failed]
        lines += [f"not finished yet: {r.line()}" for r in self.active]
        if self.failed:
            lines.append("Rerun the sweep to run the failed cells again (finished ones are kept).")
        if self.active:
            lines.append("Rerun the sweep once those jobs have ended to collect them and write the study.")
        super().__init__("\n".join(lines))


def run_sweep(
    config: SweepConfig,
    *,
    train_fn: TrainFn = train_with_nego,
    factories: FactorySource | None = None,
    echo: Callable[[str], None] = print,
    wait: bool = True,
) -> pl.DataFrame:
    """Run every unfinished cell with the configured launcher, then write the study table and plot from the cell
    directories; returns the table (one row per cell and buyer group). With ``wait=False`` the cell jobs are
    submitted and left running. Raises :class:`SweepIncomplete` when a cell failed or is still running; the
    sequential ``local`` runner raises a cell's own error instead."""
    kind = config.launcher.kind
    if not wait and kind not in launchers.OUTLIVES_PARENT:
        raise ValueError(
            f"not waiting needs a launcher whose jobs outlive this process "
            f"({', '.join(sorted(launchers.OUTLIVES_PARENT))}); the sweep's launcher is {kind!r}"
        )
    load_suite(config.suite)  # fail on a bad suite before training anything
    with exclusive_run(config.out, f"nego sweep (study {config.out})"):
        settings = cell_settings(config)
        grid = cells(config)
        todo, active = _survey(grid, config, settings, echo)
        failed: list[CellReport] = []
        if todo and kind == "local":
            for cell in todo:
                try:
                    run_cell(cell, config, train_fn, factories, echo)
                except Exception:
                    if launchers.error_summary(cell_directory(config, cell)) is not None:
                        echo(f"{cell.name}: failed (traceback: {cell_directory(config, cell) / ERROR_LOG})")
                    raise
        elif todo:
            failed, submitted = _launch(todo, config, settings, train_fn, factories, echo, wait)
            active += submitted
        rows = [finished_rows(cell_directory(config, cell), settings) for cell in grid]
        done = [r for r in rows if r is not None]
        if len(done) < len(grid):
            raise SweepIncomplete(len(done), len(grid), failed, active)
        return _write_study(pl.concat(done, how="diagonal_relaxed"), config)


def _survey(
    grid: Sequence[Cell], config: SweepConfig, settings: dict[str, Any], echo
) -> tuple[list[Cell], list[CellReport]]:
    """The unfinished cells, split into those to run now and those a live job holds or a launcher still has
    queued. A cell trained under other settings is refused here, before anything runs."""
    unfinished = []
    for cell in grid:
        directory = cell_directory(config, cell)
        trained_before(directory, settings["train_args"])
        if finished_rows(directory, settings) is None:
            unfinished.append(cell)
        else:
            echo(f"{cell.name}: finished before")
    records = [launchers.JobRecord.read(cell_directory(config, cell)) for cell in unfinished]
    todo, active = [], []
    for cell, record, live in zip(unfinished, records, launchers.still_active(records), strict=True):
        directory = cell_directory(config, cell)
        who = launchers.holder(directory)
        if who is not None:
            active.append(CellReport(cell.name, f"running: {who}", record.stdout if record else None))
            continue
        if record is not None and live:
            active.append(CellReport(cell.name, f"{record.kind} job {record.job_id} queued or running", record.stdout))
            continue
        if record is not None and live is None:
            echo(
                f"{cell.name}: cannot tell whether {record.kind} job {record.job_id} is still queued; running it again"
            )
        summary = launchers.error_summary(directory)
        if summary is not None:
            echo(f"{cell.name}: failed before ({summary}); running it again")
        todo.append(cell)
    return todo, active


def _launch(
    todo: Sequence[Cell], config: SweepConfig, settings: dict[str, Any], train_fn, factories, echo, wait: bool
) -> tuple[list[CellReport], list[CellReport]]:
    """Submit one job per cell; when waiting, collect each from its directory as its job ends. Returns the failed
    cells and the cells left running."""
    launcher = config.launcher
    folder = launcher.folder or config.out / "jobs"
    executor = launchers.make_executor(launcher, folder, name=f"nego-sweep-{config.out.name}")
    for cell in todo:
        (cell_directory(config, cell) / ERROR_LOG).unlink(missing_ok=True)
    calls = [(cell, config, train_fn, factories) for cell in todo]
    submitted = launchers.submit(executor, launcher.kind, run_cell_job, calls)
    for cell, s in zip(todo, submitted, strict=True):
        s.record.write(cell_directory(config, cell))
    ids = ", ".join(s.record.job_id for s in submitted)
    echo(f"submitted {len(todo)} cell(s) to {launcher.kind} as job(s) {ids}; logs under {folder}")
    if not wait:
        return [], [
            CellReport(c.name, f"submitted as {s.record.kind} job {s.record.job_id}", s.record.stdout)
            for c, s in zip(todo, submitted, strict=True)
        ]
    failed = []
    for i in launchers.as_finished([s.job for s in submitted]):
        report = _ended(todo[i], submitted[i], config, settings)
        if report is None:
            echo(f"{todo[i].name}: finished")
        else:
            echo(f"{todo[i].name}: failed: {report.detail} (log: {report.log})")
            failed.append(report)
    return failed, []


def _ended(
    cell: Cell, submitted: launchers.Submitted, config: SweepConfig, settings: dict[str, Any]
) -> CellReport | None:
    """None for a cell its job finished, otherwise what went wrong, read from the cell directory and the job log."""
    directory = cell_directory(config, cell)
    if finished_rows(directory, settings) is not None:
        return None
    record = submitted.record
    summary = launchers.error_summary(directory)
    if summary is not None:
        return CellReport(cell.name, f"{summary} (traceback: {directory / ERROR_LOG})", record.stderr)
    state = launchers.job_state(submitted.job)
    return CellReport(
        cell.name,
        f"the job ended without finishing the cell (state {state}){launchers.last_line(record.stderr)}",
        record.stderr,
    )


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


def _plot_gain_vs_lr(ax, study: pl.DataFrame, config: SweepConfig) -> None:
    """One size: the gain against the learning rate (log scale), a line per buyer group and seed, so the curve from
    too slow to learn through learning to collapse shows per buyer."""
    groups = list(study["group"].unique(maintain_order=True))
    seeds = list(config.seeds)
    for g, group in enumerate(groups):
        for k, seed in enumerate(seeds):
            part = study.filter((pl.col("group") == group) & (pl.col("seed") == seed)).sort("lr")
            if part.is_empty():
                continue
            shift = 1.0 + 0.06 * (g * len(seeds) + k - (len(groups) * len(seeds) - 1) / 2)  # keep bars apart
            err = [part["gain"] - part["gain_low"], part["gain_high"] - part["gain"]]
            label = group if len(seeds) == 1 else f"{group}, seed {seed}"
            ax.errorbar([lr * shift for lr in part["lr"]], part["gain"], yerr=err, fmt="o-", capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("gain over base")
    ax.set_title(f"RL gain against learning rate ({config.sizes[0]})")


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
    sizes = list(config.sizes)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.axhline(0.0, color="grey", lw=0.8)
    if len(sizes) == 1:
        _plot_gain_vs_lr(ax, study, config)
    else:
        suite_rows = study.filter(pl.col("group") == "suite")
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
