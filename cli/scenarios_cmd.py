"""``nego scenarios``: list the product categories and built-in scenarios, show one scenario, generate suites."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from nego.scenarios.analysis import analyse, offer_at
from nego.scenarios.catalog import CATEGORIES, category_names
from nego.scenarios.files import ScenarioFileError, builtin_scenarios, load_scenario, save_scenario
from nego.scenarios.generator import GeneratedId, generate_scenarios, regenerate
from nego.scenarios.issues import IssueKind
from nego.scenarios.scenario import Role, Scenario
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .errors import plain, print_error

app = typer.Typer(help="Scenarios: product categories, built-in examples, analysis and a seeded generator.")


class FileFormat(StrEnum):
    TOML = "toml"
    JSON = "json"


def _console() -> Console:
    return Console(width=120)


@app.command("list")
def list_cmd() -> None:
    """List the generator's product categories and the built-in example scenarios."""
    console = _console()
    cats = Table(title="Product categories (nego scenarios generate --category NAME)")
    for col in ("category", "segment", "product", "issues (first 3 always, the rest drawn)"):
        cats.add_column(col)
    for c in CATEGORIES:
        cats.add_row(*map(Text, (c.name, c.segment, c.product, ", ".join(s.name for s in c.issues))))
    console.print(cats)
    examples = Table(title="Built-in scenarios (nego scenarios show ID)")
    for col in ("id", "file", "product", "outcomes", "zone of agreement"):
        examples.add_column(col)
    for name, s in builtin_scenarios():
        zopa = "yes" if s.zopa else "no (by design)"
        examples.add_row(*map(Text, (s.id, name, s.product, f"{s.outcome_count:,}", zopa)))
    console.print(examples)


def resolve(ref: str) -> Scenario:
    """A scenario from a file path, a built-in id, or a generated id (CATEGORY-SEED-INDEX)."""
    path = Path(ref)
    if path.suffix in (".toml", ".json") or path.exists():
        return load_scenario(path)
    for _, s in builtin_scenarios():
        if s.id == ref:
            return s
    if GeneratedId.parse(ref) is not None:
        return regenerate(ref)
    known = ", ".join(s.id for _, s in builtin_scenarios())
    raise typer.BadParameter(
        f"{ref!r} is neither a file, a built-in id ({known}) nor a generated id such as laptops-7-0", param_hint="ID"
    )


@app.command("show")
def show_cmd(
    ref: Annotated[str, typer.Argument(metavar="ID|FILE", help="Scenario file, built-in or generated id.")],
) -> None:
    """Show a scenario: issues, both sides' private preferences and its analysis."""
    try:
        scenario = resolve(ref)
    except ScenarioFileError as e:
        _console().print(f"[red]{plain(e)}[/red]", highlight=False)
        raise typer.Exit(1) from None
    console = _console()
    console.print(f"[bold]{plain(scenario.id)}[/bold] ({plain(scenario.category)}): {plain(scenario.product)}")
    console.print(scenario.context, highlight=False, markup=False)
    console.print(f"max rounds {scenario.max_rounds}, {scenario.opener} opens, {scenario.outcome_count:,} outcomes")
    console.print(_issues_table(scenario))
    for role in (Role.SELLER, Role.BUYER):
        console.print(_side_table(scenario, role))
        brief = scenario.seller_brief if role is Role.SELLER else scenario.buyer_brief
        if brief:
            console.print(f"[dim]{role} brief (private):[/dim] {plain(brief)}", highlight=False)
    console.print(_analysis_table(scenario))


def _issues_table(scenario: Scenario) -> Table:
    table = Table(title="Issues (public)")
    for col in ("issue", "kind", "values", "unit", "description"):
        table.add_column(col)
    for i in scenario.issues:
        categorical = i.kind is IssueKind.CATEGORICAL
        values = ", ".join(i.options) if categorical else f"{i.low} .. {i.high} step {i.step}"
        table.add_row(*map(Text, (i.name, i.kind.value, values, i.unit, i.description)))
    return table


def _side_table(scenario: Scenario, role: Role) -> Table:
    prefs = scenario.preferences(role)
    table = Table(title=f"{role.value.upper()} preferences (PRIVATE to the {role}), reservation {prefs.reservation}")
    for col in ("issue", "weight", "wants"):
        table.add_column(col)
    for i in scenario.issues:
        vf = prefs.values[i.name]
        if i.kind is IssueKind.CATEGORICAL:
            wants = ", ".join(f"{k}={v:g}" for k, v in sorted(vf.table, key=lambda kv: -kv[1]))
        else:
            wants = str(vf.direction.value if vf.direction else "")
        table.add_row(Text(i.name), f"{prefs.weights[i.name]:.3f}", Text(wants))
    return table


def _analysis_table(scenario: Scenario) -> Table:
    a = analyse(scenario)
    table = Table(title="Analysis (exact over the outcome grid)")
    table.add_column("measure")
    table.add_column("value")
    table.add_row("zone of agreement", f"{'yes' if a.zopa else 'no'} ({a.zopa_size:.1%} of outcomes)")
    if a.nash_index is not None and a.nash_utilities is not None:
        u_s, u_b = a.nash_utilities
        nash = offer_at(scenario, a.nash_index).describe()
        table.add_row("Nash point", Text(f"seller {u_s:.3f}, buyer {u_b:.3f}: {nash}"))
    else:
        table.add_row("Nash point", "none (no zone of agreement)")
    table.add_row("max joint utility", f"{a.max_joint_utility:.3f}")
    table.add_row("Pareto frontier", f"{a.pareto_size} points")
    table.add_row("opposition", f"{a.opposition:.3f} (0 = no conflict, 1 = zero-sum)")
    return table


@app.command("generate")
def generate_cmd(
    out: Annotated[Path, typer.Option("--out", help="Folder to write the scenario files into.")],
    n: Annotated[int, typer.Option("--n", min=1, help="How many scenarios.")] = 10,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the suite.")] = 0,
    category: Annotated[str | None, typer.Option("--category", help="Only this product category.")] = None,
    opposition: Annotated[
        float | None, typer.Option("--opposition", min=0.0, max=1.0, help="Fix the opposition knob (0..1).")
    ] = None,
    no_zopa: Annotated[bool, typer.Option("--no-zopa", help="Build scenarios without a zone of agreement.")] = False,
    fmt: Annotated[FileFormat, typer.Option("--format", help="File format.")] = FileFormat.TOML,
) -> None:
    """Generate N scenarios from SEED and write one file per scenario (named after its id) into OUT."""
    if category is not None and category not in category_names():
        raise typer.BadParameter(f"unknown category {category!r}; known: {', '.join(category_names())}")
    scenarios = generate_scenarios(n, seed, category=category, opposition=opposition, zopa=not no_zopa)
    try:
        for s in scenarios:
            save_scenario(s, out / f"{s.id}.{fmt.value}")
    except OSError as e:  # OUT is a file, or cannot be created or written
        print_error(_console(), str(e))
        raise typer.Exit(2) from None
    _console().print(f"wrote {len(scenarios)} scenarios to {out} ({fmt.value})", highlight=False, markup=False)
