"""`nego models`: lists the registry, and prints a `vllm serve` line exposing the name the client will request."""

from __future__ import annotations

import json
import shlex

import pytest
from nego.agents.model_registry import ModelEntry, register
from nego.agents.model_specs import LLMSettings, resolve_model_spec
from nego.cli.app import app
from typer.testing import CliRunner

runner = CliRunner()


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_lists_registered_models_with_their_dev_record():
    res = runner.invoke(app, ["models"])
    assert res.exit_code == 0 and "no models registered" in _flat(res.output)
    dev = {"linear": {"utility": 0.6, "deal_rate": 0.9}, "tft": {"utility": 0.4, "deal_rate": 0.5}}
    register(ModelEntry("tiny", "/m/tiny", "", "compact", steps=300, eval={"dev": dev}))
    register(ModelEntry("tiny-rl", "/m/rl", "tiny", "compact", steps=280))
    res = runner.invoke(app, ["models"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    rows = {line.split("│")[1].strip(): line for line in res.output.splitlines() if line.count("│") > 3}
    assert set(rows) == {"tiny", "tiny-rl"}
    assert "0.500 / 0.70" in rows["tiny"] and "280" in rows["tiny-rl"] and "-" in rows["tiny-rl"]


def test_serve_a_full_checkpoint_under_the_name_the_client_requests(tmp_path):
    ckpt = tmp_path / "12b-rl"
    ckpt.mkdir()
    register(ModelEntry("12b-rl", str(ckpt), "12b", "hf"))
    res = runner.invoke(app, ["models", "--serve", "12b-rl"])
    assert res.exit_code == 0, res.output
    args = shlex.split(res.stdout.splitlines()[0])
    client = resolve_model_spec("12b-rl", LLMSettings(vllm_url="http://gpu:8000"))
    assert args == ["vllm", "serve", client.backend.model]  # vLLM names a served directory by the path it was given


def test_serve_a_lora_adapter_as_a_module_of_its_base(tmp_path):
    adapter = tmp_path / "4.5b-rl"
    adapter.mkdir()
    config = {"base_model_name_or_path": "google/gemma-4-E4B-it", "r": 32}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    register(ModelEntry("4.5b-rl", str(adapter), "4.5b", "hf"))
    res = runner.invoke(app, ["models", "--serve", "4.5b-rl"])
    assert res.exit_code == 0, res.output
    args = shlex.split(res.stdout.splitlines()[0])
    client = resolve_model_spec("4.5b-rl", LLMSettings(vllm_url="http://gpu:8000"))
    assert args[:3] == ["vllm", "serve", "google/gemma-4-E4B-it"] and "--enable-lora" in args
    assert args[args.index("--max-lora-rank") + 1] == "32"
    name, path = args[args.index("--lora-modules") + 1].split("=")
    assert name == path == client.backend.model == str(adapter)


def test_serve_refuses_what_cannot_be_served(tmp_path):
    register(ModelEntry("tiny-rl", "/m/rl", "tiny", "compact"))
    res = runner.invoke(app, ["models", "--serve", "tiny-rl"])
    assert res.exit_code == 2 and "plays in process" in _flat(res.output)
    res = runner.invoke(app, ["models", "--serve", "31b-rl"])
    assert res.exit_code == 2 and "no model '31b-rl'" in _flat(res.output)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{}")
    register(ModelEntry("broken-rl", str(broken), "x", "hf"))
    res = runner.invoke(app, ["models", "--serve", "broken-rl"])
    assert res.exit_code == 2 and "names no base_model_name_or_path" in _flat(res.output)
