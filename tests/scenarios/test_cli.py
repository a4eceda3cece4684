"""The ``nego scenarios`` commands, run through typer's CliRunner."""

from __future__ import annotations

from pathlib import Path

from nego.cli.scenarios_cmd import app
from nego.scenarios.catalog import category_names
from nego.scenarios.files import builtin_scenarios, load_scenarios, save_scenario
from nego.scenarios.generator import generate_scenario, generate_scenarios
from typer.testing import CliRunner

runner = CliRunner()


def test_list_names_every_category_and_builtin() -> None:
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    for name in (*category_names(), *(s.id for _, s in builtin_scenarios())):
        assert name in result.output


def test_show_builtin_generated_and_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["show", "office-chairs"])
    assert result.exit_code == 0, result.output
    for text in ("SELLER preferences (PRIVATE", "BUYER preferences (PRIVATE", "Nash point", "Pareto frontier"):
        assert text in result.output
    generated = generate_scenario(3, index=2)
    result = runner.invoke(app, ["show", generated.id])
    assert result.exit_code == 0 and generated.product in result.output
    path = save_scenario(generated, tmp_path / "g.json")
    result = runner.invoke(app, ["show", str(path)])
    assert result.exit_code == 0 and generated.id in result.output
    result = runner.invoke(app, ["show", "print-run-no-deal"])
    assert "none (no zone of agreement)" in result.output


def test_show_reports_bad_input(tmp_path: Path) -> None:
    assert runner.invoke(app, ["show", "no-such-scenario"]).exit_code == 2
    bad = tmp_path / "bad.toml"
    bad.write_text('id = "x"\nproduct = "y"\n')
    result = runner.invoke(app, ["show", str(bad)])
    assert result.exit_code == 1 and "issues" in result.output and "bad.toml" in result.output


def test_generate_writes_loadable_files(tmp_path: Path) -> None:
    result = runner.invoke(app, ["generate", "--n", "4", "--seed", "7", "--out", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert sorted(load_scenarios(tmp_path), key=lambda s: s.id) == sorted(generate_scenarios(4, 7), key=lambda s: s.id)
    result = runner.invoke(app, ["generate", "--n", "2", "--seed", "1", "--out", str(tmp_path / "c"),
                                 "--category", "saas", "--no-zopa"])  # fmt: skip
    assert result.exit_code == 0
    loaded = load_scenarios(tmp_path / "c")
    assert [s.category for s in loaded] == ["saas", "saas"] and not any(s.zopa for s in loaded)
    assert all(p.suffix == ".toml" for p in (tmp_path / "c").iterdir())
    assert runner.invoke(app, ["generate", "--out", str(tmp_path), "--category", "spaceships"]).exit_code == 2
