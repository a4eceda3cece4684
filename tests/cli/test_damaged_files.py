"""A file a command reads back that is damaged (cut short, edited) is named in a clear error saying what to do; an
output path it cannot create is an error line and exit status 2, not a traceback."""

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


def test_an_output_path_it_cannot_create_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = str(blocker / "run")
    for args in (
        ["simulate", "--days", "1", "--negotiations", "2", "--no-live", "--out", out],
        ["eval", "--sellers", "tft", "--suite", "eval-dev", "--baselines", "none", "--out", out],
        ["train", "--steps", "1", "--out", out],
        ["scenarios", "generate", "--n", "1", "--out", str(blocker)],
    ):
        res = runner.invoke(app, args, env={"COLUMNS": "400"})
        assert res.exit_code == 2, (args, res.output, res.exception)
        assert "error:" in res.output and "a-file" in res.output, res.output
