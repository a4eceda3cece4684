"""Hostile model replies end to end, through the real SDKs, the marketplace and the Parquet transcripts: a reply
that cannot be read is an invalid turn with feedback and a retry (never an error outcome), and a key that a
model or its server writes into a reply reaches neither the transcripts nor the other side."""

from __future__ import annotations

import json
import logging
from collections import deque

import polars as pl
import pytest
from nego.agents.llm.backends.limits import RetryPolicy
from nego.agents.llm.backends.openai_backend import OpenAIBackend
from nego.agents.llm.negotiator import LLMNegotiator
from nego.agents.llm.parsing import parse_text, read_envelope
from nego.agents.model_specs import LLMSettings
from nego.agents.registry import resolve
from nego.agents.secrets import Scrubber
from nego.market.marketplace import Job, Marketplace
from nego.market.protocol import run_negotiation
from nego.market.transcripts import TranscriptWriter, read_negotiations, read_turns
from nego.market.types import Action, ActionKind, EndReason, Observation
from nego.scenarios.scenario import Role

from ...conftest import make_widget_scenario
from ...fakes.llm_server import Control, Fault, prompt_brain, serve

OPENAI_KEY = "sk-openai-CANARY-9d2f71aa"
ANTHROPIC_KEY = "sk-ant-CANARY-51be0c77"
AGENT_TOKEN = "agent-token-CANARY-3c0e"
PLAN = {
    "seller": [{"price": p, "quantity": 10, "warranty": "1y"} for p in (150, 140, 130, 120, 110, 100)],
    "buyer": [{"price": p, "quantity": 10, "warranty": "2y"} for p in (60, 70, 80, 90, 100, 110)],
}
BRAIN = prompt_brain(PLAN, {"seller": 0.6, "buyer": 0.55})
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.01, timeout_s=5.0)
BOMBS = {
    "nesting bomb": "Here is my move: " + '{"a":' * 8_000 + "1" + "}" * 8_000,
    "huge integer": '{"action": "offer", "offer": {"price": ' + "9" * 10_000 + ', "quantity": 1, "warranty": "1y"}}',
    "open braces": "{" * 50_000,
}


def cells(frame: pl.DataFrame) -> str:
    return json.dumps([list(map(str, row)) for row in frame.iter_rows()])


class Recording:
    """A factory that builds its inner factory's negotiators and records every observation they are given."""

    def __init__(self, inner, seen: list[Observation]) -> None:
        self.inner, self.seen, self.kind = inner, seen, inner.kind

    def __call__(self, role, seed):
        negotiator, seen = self.inner(role, seed), self.seen

        class Recorder:
            async def act(self, obs: Observation) -> Action:
                seen.append(obs)
                return await negotiator.act(obs)

        return Recorder()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def play(jobs, factories, writer=None):
    market = Marketplace(factories, writer=writer, concurrency=1)
    try:
        return await market.run(jobs)
    finally:
        await market.aclose()


@pytest.mark.parametrize("bomb", sorted(BOMBS))
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_unreadable_reply_is_an_invalid_turn_with_feedback_and_a_retry(tmp_path, monkeypatch, bomb, provider):
    control = Control(faults=deque([Fault(text=BOMBS[bomb])]))
    async with serve(BRAIN, control) as srv:
        monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", srv.anthropic_url)
        settings = LLMSettings(base_url=srv.openai_url, policy=FAST)
        jobs = [Job(make_widget_scenario(), f"{provider}:seller", "linear", 0)]
        [result] = await play(jobs, lambda spec: resolve(spec, settings), TranscriptWriter(tmp_path))
        prompts = [r.body["messages"][-1]["content"] for r in srv.requests]
    assert result.outcome.end_reason is not EndReason.ERROR and result.outcome.error == ""
    assert result.outcome.invalid_seller == 1 and result.outcome.forfeits_seller == 0
    first, retry = result.turns[:2]
    assert (first.round, first.attempt, first.valid) == (1, 0, False) and first.action.kind is ActionKind.INVALID
    assert first.feedback and first.feedback == first.action.error
    assert (retry.round, retry.role, retry.attempt, retry.valid) == (1, Role.SELLER, 1, True)
    assert f"Your previous reply was not a valid move: {first.feedback[:40]}" in prompts[1]
    turns = read_turns(tmp_path).sort("index")
    row = turns.row(0, named=True)
    assert row["valid"] is False and row["feedback"] == first.feedback
    assert read_envelope(row["raw"])["text"] == BOMBS[bomb]  # what the model sent, kept whole
    assert read_negotiations(tmp_path)["end_reason"].to_list() == [result.outcome.end_reason.value]


def test_the_feedback_for_each_bomb_says_what_was_wrong():
    expected = {
        "nesting bomb": "nested 8000 levels deep",
        "huge integer": "a number of 10000 digits",
        "open braces": 'no action found: reply with one JSON object such as {"action": "offer"',
    }
    for bomb, words in expected.items():
        assert words in parse_text(BOMBS[bomb], make_widget_scenario().issues).error


async def test_a_parser_failure_is_a_counted_invalid_action_not_an_error(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    async with serve(BRAIN) as srv:
        backend = OpenAIBackend("seller", base_url=srv.openai_url, api_key="k", policy=FAST)
        seller = LLMNegotiator(backend, role=Role.SELLER, seed=1)
        buyer = LLMNegotiator(backend, role=Role.BUYER, seed=2)
        monkeypatch.setattr("nego.agents.llm.negotiator.parse_response", broken)
        result = await run_negotiation(make_widget_scenario(max_rounds=1), seller, buyer)
        await backend.aclose()
    assert result.outcome.end_reason is EndReason.DEADLINE  # every try was unreadable: forfeits, not an error
    assert result.outcome.forfeits_seller == result.outcome.forfeits_buyer == 1
    assert seller.unreadable == buyer.unreadable == 3
    turn = result.turns[0]
    assert turn.feedback.startswith("your reply could not be read (RecursionError)")
    assert read_envelope(turn.action.raw)["tool_calls"][0]["name"] == "make_offer"
    assert any("the parser failed on a reply" in r.getMessage() for r in caplog.records)


async def test_a_key_echoed_in_replies_reaches_neither_transcripts_nor_the_other_side(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    seen: list[Observation] = []
    control = Control(always=Fault(mode="say_key"))  # every reply's message is the caller's key
    async with serve(BRAIN, control) as srv:
        monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
        monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", srv.anthropic_url)
        settings = LLMSettings(base_url=srv.openai_url, policy=FAST)
        seller, buyer = "openai:seller", "anthropic:buyer"

        def factories(spec):
            factory = resolve(spec, settings)
            return Recording(factory, seen) if spec == buyer else factory

        jobs = [Job(make_widget_scenario(), seller, buyer, seed) for seed in range(2)]
        results = await play(jobs, factories, TranscriptWriter(tmp_path))
        bodies = "".join(json.dumps(r.body) for r in srv.requests)
        headers = "".join(str(r.headers) for r in srv.requests)
    assert all(r.outcome.agreed for r in results)
    assert OPENAI_KEY in headers and ANTHROPIC_KEY in headers  # the keys travelled, and the server had them
    stored = cells(read_negotiations(tmp_path)) + cells(read_turns(tmp_path))
    history = [move.message for obs in seen for move in obs.history if move.role is Role.SELLER]
    assert history and all(m == "my key is [redacted:OPENAI_API_KEY], thanks" for m in history)
    assert "[redacted:OPENAI_API_KEY]" in stored and "[redacted:ANTHROPIC_API_KEY]" in stored
    logs = "".join(r.getMessage() for r in caplog.records)
    for key in (OPENAI_KEY, ANTHROPIC_KEY):
        assert key not in stored and key not in bodies and key not in logs


def test_the_scrubber_replaces_long_values_and_leaves_short_ones():
    env = {"OPENAI_API_KEY": OPENAI_KEY, "NEGO_AGENT_TOKEN": AGENT_TOKEN, "ANTHROPIC_API_KEY": "short", "HF_TOKEN": ""}
    scrub = Scrubber.from_env(env, extra=[("VLLM_API_KEY", OPENAI_KEY + "-longer")])
    assert OPENAI_KEY not in repr(scrub) and AGENT_TOKEN not in repr(scrub)
    text = f"a {OPENAI_KEY}-longer b {OPENAI_KEY} c {AGENT_TOKEN} short"
    assert scrub(text) == ("a [redacted:VLLM_API_KEY] b [redacted:OPENAI_API_KEY] c [redacted:NEGO_AGENT_TOKEN] short")
    quoted = Scrubber((("NEGO_AGENT_TOKEN", 'tok"en\\value'),))
    assert quoted(json.dumps({"m": 'tok"en\\value'})) == '{"m": "[redacted:NEGO_AGENT_TOKEN]"}'
    action = Action.invalid(f"raw {AGENT_TOKEN}", f"got {AGENT_TOKEN!r}")
    clean = scrub.action(action)
    assert AGENT_TOKEN not in clean.raw + clean.error and scrub.action(clean) is clean
    assert not Scrubber.from_env({}) and Scrubber.from_env({})("x") == "x"
