"""`nego simulate` with a model seller, end to end through the real OpenAI SDK against a loopback fake server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from nego.cli.app import app
from nego.market.transcripts import read_negotiations, read_turns
from nego.scenarios.files import save_scenario
from typer.testing import CliRunner

from ..conftest import make_widget_scenario
from ..fakes.llm_server import Control, prompt_brain, serve

API_KEY = "sk-canary-5e1f0c9a77"


@pytest.fixture
def fake_server() -> Iterator[str]:
    brain = prompt_brain(
        {"seller": [{"price": p, "quantity": 10, "warranty": "1y"} for p in (150, 140, 130, 120, 110, 100)]},
        {"seller": 0.55},
    )
    ready: dict[str, str] = {}
    started, stop = threading.Event(), None

    def run() -> None:
        nonlocal stop

        async def main() -> None:
            nonlocal stop
            stop = asyncio.Event()
            async with serve(brain, Control(latency_s=0.0)) as server:
                ready["url"] = server.host
                started.set()
                await stop.wait()

        loop = asyncio.new_event_loop()
        ready["loop"] = loop  # type: ignore[assignment]
        loop.run_until_complete(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    yield ready["url"]
    ready["loop"].call_soon_threadsafe(stop.set)  # type: ignore[attr-defined]
    thread.join(10)


def test_simulate_with_an_openai_seller(tmp_path, fake_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    scenario_file = save_scenario(make_widget_scenario(), tmp_path / "widgets.toml")
    out = tmp_path / "run"
    args = [
        "simulate",
        "--sellers",
        "openai:fake-model",
        "--buyers",
        "linear",
        "--scenarios",
        str(scenario_file),
        "--days",
        "1",
        "--negotiations",
        "3",
        "--base-url",
        f"{fake_server}/v1",
        "--out",
        str(out),
        "--no-live",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    neg = read_negotiations(out, latest=True)
    assert neg.height == 3 and (neg["end_reason"] != "error").all(), neg["error"].to_list()
    assert (neg["seller_prompt_tokens"] > 0).all()
    turns = read_turns(out)
    seller_raw = turns.filter(turns["role"] == "seller")["raw"].to_list()
    assert all("negotiator-v2:" in r for r in seller_raw)  # the prompt template id is recorded with every move
    for table in (neg, turns):  # the API key is nowhere in the transcripts
        assert not any(API_KEY in str(v) for row in table.iter_rows() for v in row)


def test_model_spec_without_key_fails_before_running(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    res = CliRunner().invoke(app, ["simulate", "--sellers", "openai:gpt-5-mini", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "OPENAI_API_KEY" in res.output
