"""``nego models``: the local model registry, and how to serve a registered chat model with vLLM."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .errors import print_error


def _dev_summary(entry) -> str:
    """Mean dev utility and deal rate recorded at registration (over the dev buyers), or '-'."""
    dev = (entry.eval or {}).get("dev") or {}
    rows = [v for v in dev.values() if isinstance(v, dict) and "utility" in v]
    if not rows:
        return "-"
    utility = sum(r["utility"] for r in rows) / len(rows)
    deals = sum(r.get("deal_rate", 0.0) for r in rows) / len(rows)
    return f"{utility:.3f} / {deals:.2f}"


def models(
    serve: Annotated[
        str | None,
        typer.Option(
            help="Print the `vllm serve` command that serves this registered chat model where NEGO_VLLM_URL finds it."
        ),
    ] = None,
) -> None:
    """List the registered seller models (trained by `nego train`), or print how to serve one with vLLM."""
    from nego.agents.model_registry import RegistryError, list_models, lookup, registry_path

    console = Console()
    try:
        if serve is not None:
            from nego.agents.llm.serving import vllm_serve_command

            entry = lookup(serve)
            if entry is None:
                raise ValueError(f"no model {serve!r} in the local registry ({registry_path()}); see `nego models`")
            typer.echo(vllm_serve_command(entry))
            typer.echo(f"# then: NEGO_VLLM_URL=http://HOST:8000 nego simulate --sellers {entry.name}", err=True)
            return
        entries = list_models()
    except (RegistryError, ValueError) as e:
        print_error(console, str(e))
        raise typer.Exit(2) from None
    if not entries:
        line = f"no models registered in {registry_path()}; `nego train` builds and registers tiny and tiny-rl"
        console.print(line, markup=False)
        return
    table = Table(title=Text(f"Registered models ({registry_path()})", style="table.title"))
    for col in ("name", "format", "base", "steps", "dev utility / deals", "created"):
        table.add_column(col, justify="right" if col == "steps" else "left")
    for e in entries:
        steps = str(e.steps) + (" (cut short)" if e.config.get("cut_short") else "")
        cells = (e.name, e.format, e.base or "-", steps, _dev_summary(e), e.created[:16].replace("T", " "))
        table.add_row(*map(Text, cells))
    console.print(table)
    width = max(len(e.name) for e in entries)
    for e in entries:
        console.print(f"{e.name:<{width}}  {e.path}", highlight=False, markup=False, soft_wrap=True)
