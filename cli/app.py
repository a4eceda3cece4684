"""The ``nego`` command line: one typer app; each command lives in its own module and imports heavy parts lazily."""

from __future__ import annotations

import logging

import typer
from rich.console import Console

from .eval_cmd import eval_, report, sweep
from .models_cmd import models
from .scenarios_cmd import app as scenarios_app
from .serve_cmd import serve_agent
from .simulate_cmd import simulate
from .train_cmd import train

app = typer.Typer(
    name="nego",
    help="A marketplace simulator for bilateral multi-issue bargaining, with an RL plugin for LLM sellers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(simulate)
app.add_typer(scenarios_app, name="scenarios")
app.command("serve-agent")(serve_agent)
app.command()(train)
app.command()(models)
app.command("eval")(eval_)
app.command()(report)
app.command()(sweep)


@app.command()
def agents() -> None:
    """List the agent specs that --sellers and --buyers accept: the built-in ones, then plugin agents that installed
    packages declare (entry-point group nego.agents) with their distribution and target, broken ones with why."""
    from nego.agents.plugins import AGENT_GROUP, list_plugins
    from nego.agents.registry import builtin_form, known_specs

    console = Console()
    for spec in known_specs():
        console.print(spec, highlight=False, markup=False)
    entries = list_plugins(AGENT_GROUP, builtin_form)
    if not entries:
        console.print(f"no plugin agents installed (entry-point group {AGENT_GROUP})", highlight=False, markup=False)
        return
    console.print(f"plugin agents (entry-point group {AGENT_GROUP}):", highlight=False, markup=False)
    width = max(len(e.name) for e in entries)
    for e in entries:
        line = f"{e.name:<{width}}  {e.target}  from {e.distribution}"
        console.print(
            line + (f"  {e.status}: {e.problem}" if e.problem else ""), highlight=False, markup=False, soft_wrap=True
        )


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()
