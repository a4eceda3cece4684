"""``nego eval``, ``nego report`` and ``nego sweep``: fixed-suite evaluation with paired statistics, its
Markdown report, and a size x learning-rate study."""

from __future__ import annotations

import functools
import inspect
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import polars as pl
import typer
from nego.agents.threads import set_threads
from nego.evaluation.config import EvalConfig, SweepConfig
from rich.console import Console
from rich.table import Table

from .config_options import config_options, given_values, parameters, signature
from .errors import exit_for_errors, plain, print_error
from .options import model_parameters, take_model_options
from .tables import Layout


def _console() -> Console:
    """A console wide enough for the summary table when the output is not a terminal (logs, pipes)."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 140))


def summary_tables(comparisons: pl.DataFrame, width: int) -> list[Table]:
    """The rich summary, one table per buyer group (the pooled suite first): per arm, score with interval, deal
    rate, gain over base with p-values; with reference sellers, their rows after the arms' (marked ``(ref)``), the
    mean optimality gap, and per buyer each arm's paired difference from the best reference with that reference's
    name. Arm and buyer names are never cut; the tables share their column widths; on a terminal too narrow for all
    columns the scenario count, then the unadjusted p-value, then the gap are left out."""
    from nego.evaluation.report import format_p
    from nego.evaluation.runner import SUITE_GROUP

    if comparisons.is_empty():  # no arm had a negotiation without error
        return []
    headers = ("arm", "n", "scenarios", "score [95% CI]", "deal", "gain vs base [95% CI]", "p", "p Holm")
    referenced = "kind" in comparisons.columns
    if referenced:
        headers += ("gap", "vs best rule seller [95% CI]", "best rule")
    rows = []
    for r in comparisons.iter_rows(named=True):
        row = (
            r["arm"] + (" (ref)" if r.get("kind") == "reference" else ""),
            str(r["n"]),
            str(r["clusters"]),
            _interval(r["score"], r["score_low"], r["score_high"]),
            f"{r['deal_rate']:.2f}",
            _interval(r["gain"], r["gain_low"], r["gain_high"], signed=True),
            format_p(r["p_value"]),
            format_p(r["p_holm"]),
        )
        if referenced:
            gap = "" if r["optimality_gap"] is None else f"{r['optimality_gap']:.3f}"
            versus = _interval(r["vs_best"], r["vs_best_low"], r["vs_best_high"], signed=True)
            row += (gap, versus, r["best_rule"] or "")
        rows.append(row)
    layout = Layout.of(headers, rows).fit(width, optional=("scenarios", "p", "gap"))
    tables = []
    for group in comparisons["group"].unique(maintain_order=True):
        title = "suite (held-out buyers pooled)" if group == SUITE_GROUP else f"buyer {group}"
        indices = [i for i, g in enumerate(comparisons["group"]) if g == group]
        tables.append(layout.table(title, indices, title_justify="left"))
    return tables


def _interval(mean: float | None, low: float | None, high: float | None, signed: bool = False) -> str:
    """'0.512 [0.498,0.527]': on a narrow terminal the interval wraps onto its own line, whole."""
    from nego.evaluation.report import format_interval

    return format_interval(mean, low, high, signed).replace(", ", ",")


def eval_(
    shards: int | None = None, launcher: str | None = None, launcher_config: Path | None = None, **values: Any
) -> None:
    """Evaluate seller arms on a frozen suite against held-out buyers, with paired statistics."""
    from nego.evaluation.config import shard_config
    from nego.evaluation.runner import evaluate
    from nego.evaluation.shards import ShardsFailed, evaluate_sharded

    console = _console()
    try:
        sharding = shard_config(shards, launcher, launcher_config)
        model, per_kind = take_model_options(values)
        given = given_values(EVAL_OPTIONS, values)
        given.setdefault("out", Path("runs") / "eval" / Path(given.get("suite", _SUITE_DEFAULT)).stem)
        settings = model.settings()
        play = {"template": settings.template, "temperature": settings.temperature, "max_tokens": settings.max_tokens}
        config = EvalConfig(**given, per_kind=per_kind, play={**play, "tools": settings.tools})
        set_threads(config.threads)
        from nego.agents.registry import resolve

        # a partial, not a lambda: worker processes (--workers) and shard jobs rebuild the factories from it
        factories = functools.partial(resolve, settings=settings)
        if sharding is None:
            result = evaluate(config, factories=factories)
        else:
            echo = functools.partial(console.print, highlight=False, markup=False)
            result = evaluate_sharded(config, sharding, factories, echo=echo)
    except ShardsFailed as e:
        print_error(console, str(e), highlight=False)
        raise typer.Exit(1) from None
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        print_error(console, str(e))
        raise typer.Exit(2) from None
    s = result.suite
    title = (
        f"suite {s.name} (hash {s.content_hash()}), {len(s.slots())} negotiations per arm over "
        f"{len(s.scenarios)} scenarios; played now: {result.played}"
    )
    console.print(title, highlight=False, markup=False)
    if result.references:
        console.print(
            f"reference sellers on the same negotiations: {', '.join(result.references)}; "
            "--baselines none leaves them out",
            highlight=False,
            markup=False,
        )
    for table in summary_tables(result.comparisons, console.width):
        console.print()
        console.print(table)
    from nego.evaluation.leakage import warning_lines

    for line in warning_lines(result.trained_against_held_out):
        console.print(f"[yellow]warning:[/yellow] {plain(line)}")
    console.print(f"metrics: {config.out / 'metrics.parquet'}; report: nego report {config.out}", markup=False)
    arms = result.metrics.filter(pl.col("arm").is_in(config.sellers))  # the exit status speaks of the arms
    exit_for_errors(_latest_attempts(config.out, arms), console, "negotiations")


def _latest_attempts(out: Path, metrics: Any) -> Any:
    """The transcripts' latest attempts of the negotiations this evaluation planned (error messages included)."""
    from nego.market.transcripts import read_negotiations

    ids = metrics["negotiation_id"]
    return read_negotiations(out / "transcripts", latest=True).filter(pl.col("negotiation_id").is_in(ids))


EVAL_OPTIONS = config_options(EvalConfig, optional=("out",))
_SUITE_DEFAULT = next(f.default for f in fields(EvalConfig) if f.name == "suite")


def _shard_parameters() -> list[inspect.Parameter]:
    """``--shards``, ``--launcher`` and ``--launcher-config`` of ``nego eval``."""
    options = {
        "shards": (
            int | None,
            "Split the run into K launcher jobs (--launcher) that play every K-th negotiation into OUT/shards/, "
            "then merge them into OUT: the same transcripts and statistics as without --shards.",
        ),
        "launcher": (str | None, "Where the shard jobs run: submitit-local, submitit-debug or slurm."),
        "launcher_config": (
            Path | None,
            "TOML file whose launcher table holds the SLURM settings (the keys of a sweep file's sweep.launcher).",
        ),
    }
    return [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--" + name.replace("_", "-"), help=text),
            annotation=annotation,
        )
        for name, (annotation, text) in options.items()
    ]


eval_.__signature__ = signature(  # type: ignore[attr-defined]
    parameters(EVAL_OPTIONS), model_parameters(), _shard_parameters()
)


def report(directory: Annotated[Path, typer.Argument(help="An evaluation run directory (from nego eval).")]) -> None:
    """Write report.md and PNG plots for an evaluation run."""
    from nego.evaluation.report import load_run, write_report

    console = Console()
    try:
        path = write_report(directory)
        man = load_run(directory).manifest
    except (ValueError, OSError, RuntimeError) as e:
        print_error(console, str(e))
        raise typer.Exit(2) from None
    console.print(f"suite {man['suite']} (hash {man['suite_hash']}); report written to {path}", markup=False)


def sweep(config: Path, launcher: str | None = None, wait: bool = True, **values: Any) -> None:
    """Train every size x learning rate (x seed), evaluate each on one suite, and write the study table."""
    import dataclasses

    from nego.evaluation.config import load_sweep_config
    from nego.evaluation.sweep import SweepIncomplete, run_sweep

    console = _console()
    try:
        cfg = load_sweep_config(config, given_values(SWEEP_OPTIONS, values))
        if launcher is not None:
            cfg = dataclasses.replace(cfg, launcher=dataclasses.replace(cfg.launcher, kind=launcher))
        study = run_sweep(cfg, echo=lambda line: console.print(line, highlight=False, markup=False), wait=wait)
    except SweepIncomplete as e:
        console.print(str(e), highlight=False, markup=False)
        raise typer.Exit(1 if e.failed else 0) from None
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        print_error(console, str(e))
        raise typer.Exit(2) from None
    from nego.evaluation.report import format_interval, format_p

    headers = ("size", "lr", "seed", "buyers", "gain [95% CI]", "p Holm")
    rows = [
        (
            r["size"],
            repr(r["lr"]),
            str(r["seed"]),
            r["group"],
            format_interval(r["gain"], r["gain_low"], r["gain_high"], signed=True),
            format_p(r["p_holm"]),
        )
        for r in study.iter_rows(named=True)
    ]
    console.print(Layout.of(headers, rows, names=4).table(f"gain over base ({cfg.suite})", title_justify="left"))
    console.print(f"study: {cfg.out / 'study.md'}", markup=False)


SWEEP_OPTIONS = config_options(SweepConfig, optional=("out",))
sweep.__signature__ = signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter(
            "config",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=Annotated[
                Path, typer.Argument(help="Sweep TOML file: a sweep table, see configs/study-*.toml.")
            ],
        )
    ],
    [
        inspect.Parameter(
            "launcher",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(
                None,
                "--launcher",
                help="Run the cells with: local, submitit-local, submitit-debug or slurm (default: the file's).",
            ),
            annotation=str | None,
        ),
        inspect.Parameter(
            "wait",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(
                True,
                "--wait/--no-wait",
                help="Wait for the cell jobs; --no-wait submits them and exits (rerun to collect).",
            ),
            annotation=bool,
        ),
    ],
    parameters(SWEEP_OPTIONS, layered=True),
)
