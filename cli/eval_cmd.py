"""``nego eval``, ``nego report`` and ``nego sweep``: fixed-suite evaluation with paired statistics, its
Markdown report, and a size x learning-rate study."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from .options import (
    BaseUrl,
    MaxTokens,
    ModelOptions,
    PerKind,
    Prices,
    Temperature,
    Template,
    Tools,
    parse_per_kind,
    parse_specs,
)


def _console() -> Console:
    """A console wide enough for the summary table when the output is not a terminal (logs, pipes)."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 140))


def summary_table(comparisons, title: str) -> Table:
    """The rich summary: per buyer group and arm, score with interval, deal rate, gain over base with p-values."""
    from nego.evaluation.report import format_interval, format_p

    table = Table(title=title, title_justify="left")
    for name, justify in (
        ("buyers", "left"),
        ("arm", "left"),
        ("n", "right"),
        ("scenarios", "right"),
        ("score [95% CI]", "left"),
        ("deal", "right"),
        ("gain vs base [95% CI]", "left"),
        ("p", "right"),
        ("p Holm", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=name not in ("buyers", "arm"))
    previous = None
    for r in comparisons.iter_rows(named=True):
        if previous is not None and r["group"] != previous:
            table.add_section()
        previous = r["group"]
        table.add_row(
            r["group"],
            r["arm"],
            str(r["n"]),
            str(r["clusters"]),
            format_interval(r["score"], r["score_low"], r["score_high"]),
            f"{r['deal_rate']:.2f}",
            format_interval(r["gain"], r["gain_low"], r["gain_high"], signed=True),
            format_p(r["p_value"]),
            format_p(r["p_holm"]),
        )
    return table


def eval_(
    sellers: Annotated[str, typer.Option(help="Seller specs, comma-separated; the first is the base arm.")],
    suite: Annotated[str, typer.Option(help="Suite: eval-1152, eval-dev, or a suite JSON file.")] = "eval-1152",
    buyers: Annotated[
        str | None, typer.Option(help="Two buyer specs replacing the held-out defaults (walker,picky).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Run directory (resumes if it exists). Default runs/eval/SUITE.")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Negotiations in flight at once.")] = 64,
    diagnostic: Annotated[str, typer.Option(help="Extra diagnostic buyer; 'none' to skip.")] = "hardliner",
    resamples: Annotated[int, typer.Option(help="Bootstrap and permutation resamples (>= 1000).")] = 10_000,
    seed: Annotated[int, typer.Option(help="Seed of the resampling.")] = 0,
    gap: Annotated[bool, typer.Option(help="Compute the optimality gap against rule-based buyers.")] = True,
    per_kind: PerKind = None,
    base_url: BaseUrl = None,
    template: Template = None,
    tools: Tools = None,
    temperature: Temperature = None,
    max_tokens: MaxTokens = None,
    prices: Prices = None,
) -> None:
    """Evaluate seller arms on a frozen suite against held-out buyers, with paired statistics."""
    from nego.evaluation.config import EvalConfig
    from nego.evaluation.runner import evaluate
    from nego.evaluation.suites import DEFAULT_BUYERS

    console = _console()
    try:
        settings = ModelOptions(base_url, template, tools, prices, temperature, max_tokens).settings()
        play = {"template": settings.template, "temperature": settings.temperature, "max_tokens": settings.max_tokens}
        config = EvalConfig(
            play={**play, "tools": settings.tools},
            sellers=parse_specs(sellers, "seller"),
            out=out or Path("runs") / "eval" / Path(suite).stem,
            suite=suite,
            buyers=parse_specs(buyers, "buyer") if buyers else DEFAULT_BUYERS,
            diagnostic=None if diagnostic.lower() == "none" else diagnostic,
            concurrency=concurrency,
            resamples=resamples,
            seed=seed,
            optimality_gap=gap,
            per_kind=parse_per_kind(per_kind),
        )
        from nego.agents.registry import resolve

        result = evaluate(config, factories=lambda spec: resolve(spec, settings))
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    s = result.suite
    title = (
        f"suite {s.name} (hash {s.content_hash()}), {len(s.slots())} negotiations per arm over "
        f"{len(s.scenarios)} scenarios; played now: {result.played}"
    )
    console.print(summary_table(result.comparisons, title))
    from nego.evaluation.leakage import warning_lines

    for line in warning_lines(result.trained_against_held_out):
        console.print(f"[yellow]warning:[/yellow] {line}")
    console.print(f"metrics: {config.out / 'metrics.parquet'}; report: nego report {config.out}")


def report(directory: Annotated[Path, typer.Argument(help="An evaluation run directory (from nego eval).")]) -> None:
    """Write report.md and PNG plots for an evaluation run."""
    from nego.evaluation.report import load_run, write_report

    console = Console()
    try:
        path = write_report(directory)
        man = load_run(directory).manifest
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    console.print(f"suite {man['suite']} (hash {man['suite_hash']}); report written to {path}")


def sweep(
    config: Annotated[Path, typer.Argument(help="Sweep TOML file with a [sweep] table.")],
    launcher: Annotated[
        str | None,
        typer.Option(help="Run the cells with: local, submitit-local, submitit-debug or slurm (default: the file's)."),
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="Wait for the cell jobs; --no-wait submits them and exits (rerun to collect).")
    ] = True,
) -> None:
    """Train every size x learning rate (x seed), evaluate each on one suite, and write the study table."""
    import dataclasses

    from nego.evaluation.config import load_sweep_config
    from nego.evaluation.sweep import SweepIncomplete, run_sweep
    from rich.markup import escape

    console = _console()
    try:
        cfg = load_sweep_config(config)
        if launcher is not None:
            cfg = dataclasses.replace(cfg, launcher=dataclasses.replace(cfg.launcher, kind=launcher))
        study = run_sweep(cfg, echo=lambda line: console.print(line, highlight=False, markup=False), wait=wait)
    except SweepIncomplete as e:
        console.print(str(e), highlight=False, markup=False)
        raise typer.Exit(1 if e.failed else 0) from None
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")  # messages name TOML tables: [sweep.launcher]
        raise typer.Exit(2) from None
    from nego.evaluation.report import format_interval, format_p

    table = Table(title=f"gain over base ({cfg.suite})", title_justify="left")
    for name in ("size", "lr", "seed", "buyers", "gain [95% CI]", "p Holm"):
        table.add_column(name)
    for r in study.iter_rows(named=True):
        table.add_row(
            r["size"],
            repr(r["lr"]),
            str(r["seed"]),
            r["group"],
            format_interval(r["gain"], r["gain_low"], r["gain_high"], signed=True),
            format_p(r["p_holm"]),
        )
    console.print(table)
    console.print(f"study: {cfg.out / 'study.md'}")
