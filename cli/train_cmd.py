"""`nego train`: the options are generated from TrainConfig, so the help text is written once."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Optional

import typer
from nego.agents.threads import set_threads
from nego.market.locks import DirectoryBusy
from nego.training.config import ConfigError, TrainConfig, from_mapping, load_toml, model_preset
from rich.console import Console

from .config_options import config_options, given_values, parameters, signature

OPTIONS = config_options(TrainConfig)


def build_config(config: Path | None, options: dict[str, Any]) -> TrainConfig:
    """TOML file (if any; else the model's preset, see :data:`~nego.training.config.PRESETS`) first, then the
    options given on the command line; ``--resume`` restores the run's own."""
    given = given_values(OPTIONS, options)
    if given.get("resume"):
        from nego.training.checkpoints import load_run_config

        base = load_run_config(Path(given["resume"]))
        return from_mapping(given, "command line", base)
    base = load_toml(config) if config is not None else model_preset(str(given.get("model", TrainConfig.model)))
    return from_mapping(given, "command line", base)


def train(**kwargs: Any) -> None:
    """Warm-start and GRPO-train a seller; with no options, the tiny model on CPU in minutes."""
    config = kwargs.pop("config", None)
    live = kwargs.pop("live", None)
    from nego.training.grpo import train as run

    try:
        cfg = build_config(config, kwargs)
        set_threads(cfg.threads)
        _warn_if_training_on_held_out(cfg)
        console = Console()
        if console.is_terminal if live is None else live:
            result = _run_live(run, cfg, console)
        else:
            result = run(cfg, echo=typer.echo)
    except (ConfigError, DirectoryBusy, OSError) as e:  # OSError: an --out it cannot create or write, a full disk
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"done in {result.seconds / 60:.1f} min: {result.base_name} and {result.rl_name} registered "
        f"({result.steps} GRPO steps); run directory {result.run_dir}"
    )
    if result.stopped_early:
        typer.secho(
            f"WARNING: cut short by the time cap at {result.steps} of {cfg.steps} GRPO steps", err=True, fg="red"
        )


def _run_live(run: Any, cfg: TrainConfig, console: Console) -> Any:
    """Train under the rich live view: curves, the latest step, dev evaluations; messages scroll above it."""
    from rich.live import Live

    from .train_live import TrainWatch

    watch = TrainWatch(cfg.steps, cfg.run_name, cfg.time_budget_min)
    with Live(get_renderable=watch.render, console=console, refresh_per_second=2):
        result = run(cfg, echo=lambda s: console.print(s, markup=False, highlight=False), observer=watch)
    if not console.is_terminal:
        console.line()  # rich ends the last frame with a newline only on a terminal
    return result


def _warn_if_training_on_held_out(cfg: TrainConfig) -> None:
    from nego.evaluation.leakage import families
    from nego.evaluation.suites import DEFAULT_BUYERS, DIAGNOSTIC_BUYER

    shared = sorted(families(cfg.train_buyers) & families([*DEFAULT_BUYERS, DIAGNOSTIC_BUYER]))
    if shared:
        typer.echo(
            f"warning: the training pool includes {', '.join(shared)}, which `nego eval` holds out by default; "
            "evaluations against it will mark this model as not held out",
            err=True,
        )


train.__signature__ = signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--config", help="TOML file of training options (see nego/training/*.toml)"),
            annotation=Optional[Path],  # noqa: UP045 - typer reads the annotation at runtime
        ),
        inspect.Parameter(
            "live",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--live/--no-live", help="Rich live view with curves (default: on a terminal)."),
            annotation=Optional[bool],  # noqa: UP045
        ),
    ],
    parameters(OPTIONS, layered=True),
)
