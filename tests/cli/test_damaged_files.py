"""A file a command reads back that is damaged (cut short, edited) is named in a clear error saying what to do."""

from __future__ import annotations

from pathlib import Path

from nego.cli.app import app
from typer.testing import CliRunner

runner = CliRunner()


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_run_manifest_or_training_config_that_is_not_json_is_named_with_what_to_do(tmp_path: Path) -> None:
    run = tmp_path / "eval"
    run.mkdir()
    (run / "run.json").write_text('{"suite": "eval-dev", "suite_ha')  # cut short
    args = ["eval", "--sellers", "tft", "--suite", "eval-dev", "--baselines", "none", "--out", str(run)]
    for cmd in (args, ["report", str(run)]):
        res = runner.invoke(app, cmd, env={"COLUMNS": "400"})
        assert res.exit_code == 2, res.output
        assert f"{run / 'run.json'} is not a run manifest" in _flat(res.output)
        assert "choose another --out" in res.output
    train = tmp_path / "train"
    train.mkdir()
    (train / "config.json").write_text('{"steps": 3,')
    res = runner.invoke(app, ["train", "--resume", str(train)], env={"COLUMNS": "400"})
    assert res.exit_code == 2, res.output
    assert f"{train / 'config.json'} is not valid JSON" in _flat(res.output)
