"""LLM negotiators in the marketplace, end to end through the real SDKs and the lean OpenAI client against the
loopback fake server: both OpenAI clients play the same negotiations to the same transcripts,
failing backends become error outcomes that a resumed run plays again, every injected fault ends as a retry,
a counted invalid action or a recorded error, the vLLM tool path, and API keys that appear nowhere."""

from __future__ import annotations

import json
import logging
from collections import deque

import polars as pl
import pytest
from nego.agents.llm.backends.limits import Price, PriceTable, RetryPolicy
from nego.agents.llm.parsing import read_envelope
from nego.agents.model_specs import LLMSettings
from nego.agents.registry import resolve
from nego.market.marketplace import Job, Marketplace
from nego.market.transcripts import TranscriptWriter, read_negotiations, read_turns
from nego.market.types import EndReason

from ...conftest import make_widget_scenario
from ...fakes.llm_server import Control, Fault, prompt_brain, serve

OPENAI_KEY = "sk-openai-CANARY-71c3e9"
ANTHROPIC_KEY = "sk-ant-CANARY-0b84d2"
PLAN = {
    "seller": [{"price": p, "quantity": 10, "warranty": "1y"} for p in (150, 140, 130, 120, 110, 100)],
    "buyer": [{"price": p, "quantity": 10, "warranty": "2y"} for p in (60, 70, 80, 90, 100, 110)],
}
BRAIN = prompt_brain(PLAN, {"seller": 0.6, "buyer": 0.55})
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.001, max_delay_s=0.01, max_retry_after_s=1.0, timeout_s=5.0)
SELLER, BUYER = "openai:seller-model", "anthropic:buyer-model"
CLIENTS = pytest.mark.parametrize("client", ["lean", "sdk"])


async def play(jobs, settings, writer=None, **market_options):
    market = Marketplace(lambda spec: resolve(spec, settings), writer=writer, **market_options)
    try:
        return await market.run(jobs)
    finally:
        await market.aclose()


def cells(frame: pl.DataFrame) -> str:
    return json.dumps([list(map(str, row)) for row in frame.iter_rows()])


@CLIENTS
async def test_a_failing_backend_is_an_error_outcome_that_a_resumed_run_plays_again(
    tmp_path, monkeypatch, caplog, client
):
    caplog.set_level(logging.DEBUG)
    control = Control(always=Fault(status=503, mode="echo_key"))  # down, and echoing the caller's credential
    async with serve(BRAIN, control) as srv:
        monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
        monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", srv.anthropic_url)
        prices = PriceTable({"seller-model": Price(1.0, 2.0), "buyer-model": Price(3.0, 4.0)})
        settings = LLMSettings(base_url=srv.openai_url, policy=FAST, prices=prices, client=client)
        jobs = [Job(make_widget_scenario(), SELLER, BUYER, seed) for seed in range(2)]

        first = await play(jobs, settings, TranscriptWriter(tmp_path))
        assert [r.outcome.end_reason for r in first] == [EndReason.ERROR] * 2
        for r in first:
            assert "BackendError" in r.outcome.error and "gave up after 3 tries" in r.outcome.error
            assert "HTTP 503" in r.outcome.error and "invalid credential Bearer ***" in r.outcome.error
        assert len(srv.requests) == 2 * FAST.max_attempts  # each seller's opening offer, tried 3 times

        control.always = None  # the server is back
        second = await play(jobs, settings, TranscriptWriter(tmp_path))
    assert [r.outcome.end_reason for r in second] == [EndReason.AGREEMENT] * 2

    everything = read_negotiations(tmp_path)
    assert sorted(everything["attempt"].to_list()) == [0, 0, 1, 1]
    latest = read_negotiations(tmp_path, latest=True)
    assert latest.height == 2 and latest["negotiation_id"].n_unique() == 2
    assert latest["attempt"].to_list() == [1, 1] and (latest["end_reason"] == "agreement").all()
    assert (latest["seller_prompt_tokens"] > 0).all() and (latest["buyer_completion_tokens"] > 0).all()
    assert (latest["seller_cost_usd"] > 0).all() and (latest["buyer_latency_s"] > 0).all()
    errors = everything.filter(pl.col("attempt") == 0)
    assert (errors["end_reason"] == "error").all() and errors["error"].str.contains("HTTP 503").all()

    text = cells(everything) + cells(read_turns(tmp_path)) + "".join(r.getMessage() for r in caplog.records)
    assert "***" in text  # the echoed credential reached the error messages and the retry log, redacted
    assert OPENAI_KEY not in text and ANTHROPIC_KEY not in text


FAULTS = [
    Fault(status=429, retry_after="0.01"),
    Fault(),  # a fault that does nothing: the retry of the one before succeeds
    Fault(status=429),
    Fault(),
    Fault(status=500),
    Fault(),
    Fault(mode="truncated"),
    Fault(),
    Fault(mode="empty_choices"),
    Fault(),
    Fault(mode="missing_field"),
    Fault(),
    Fault(delay_s=30.0),  # past the per-try timeout
    Fault(),
    Fault(mode="wrong_types"),  # a counted invalid action, answered with feedback
    Fault(mode="missing_arg"),  # another, on the retry of the same turn
]


@CLIENTS
async def test_every_fault_ends_as_a_retry_a_counted_invalid_action_or_an_error(tmp_path, client):
    control = Control(faults=deque(FAULTS))
    async with serve(BRAIN, control) as srv:
        policy = RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.01, timeout_s=1.0)
        settings = LLMSettings(base_url=srv.openai_url, policy=policy, client=client)
        jobs = [Job(make_widget_scenario(), "openai:m", "linear", seed) for seed in range(3)]
        # one negotiation at a time, so the queued faults meet the requests in a known order
        results = await play(jobs, settings, TranscriptWriter(tmp_path), concurrency=1)
        bodies = [r.body for r in srv.requests]
    retried = 7  # the HTTP errors, broken replies and the timeout
    assert all(r.outcome.end_reason is not EndReason.ERROR for r in results)
    assert sorted(r.outcome.invalid_seller for r in results) == [0, 0, 2]
    assert sum(r.usage_seller.calls for r in results) == len(bodies) - retried
    sloppy = next(r for r in results if r.outcome.invalid_seller)
    invalid = [t for t in sloppy.turns if not t.valid]
    assert "price must be a number" in invalid[0].feedback and "missing value(s) for price" in invalid[1].feedback
    for turn in invalid:  # the raw reply is kept with every invalid output
        assert read_envelope(turn.action.raw)["tool_calls"][0]["name"] == "make_offer"
    prompts = [b["messages"][-1]["content"] for b in bodies]
    assert any("Your previous reply was not a valid move: price must be a number" in p for p in prompts)
    stored = read_negotiations(tmp_path, latest=True)
    assert stored.height == 3 and stored["invalid_seller"].sum() == 2


@CLIENTS
@pytest.mark.parametrize("tools", [True, False])
async def test_vllm_spec_with_and_without_tools(monkeypatch, tools, client):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    async with serve(BRAIN) as srv:
        settings = LLMSettings(tools=tools or None, policy=FAST, client=client)
        spec = f"vllm:served/model@{srv.host}"
        results = await play([Job(make_widget_scenario(), spec, "linear", 0)], settings)
        requests = list(srv.requests)
    assert results[0].outcome.end_reason is not EndReason.ERROR and results[0].usage_seller.calls == len(requests)
    for request in requests:
        body = request.path, request.body
        assert body[0] == "/v1/chat/completions" and body[1]["model"] == "served/model"
        assert body[1]["max_tokens"] == 512 and "max_completion_tokens" not in body[1]  # what vllm serve reads
        assert ("tools" in body[1]) is tools
    if tools:  # vLLM's tool parser answers with tool_calls, which the parser reads
        assert [t["function"]["name"] for t in requests[0].body["tools"]] == ["make_offer", "accept", "walk_away"]
        assert "calling exactly one of the tools" in requests[0].body["messages"][0]["content"]
    raw = read_envelope(results[0].turns[0].action.raw)
    assert bool(raw["tool_calls"]) is tools and bool(raw["text"]) is not tools


@CLIENTS
async def test_a_backend_shared_by_both_sides_never_sends_one_sides_brief_for_the_other(monkeypatch, client):
    canary = "CANARY-SELLER-BRIEF-4417"
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    async with serve(BRAIN) as srv:
        settings = LLMSettings(base_url=srv.openai_url, policy=FAST, client=client)
        scenario = make_widget_scenario(seller_brief=f"Clear old stock first. {canary}")
        jobs = [Job(scenario, "openai:same", "openai:same", seed) for seed in range(2)]
        results = await play(jobs, settings)
        bodies = [json.dumps(r.body) for r in srv.requests]
    assert all(r.outcome.agreed for r in results)
    seller = [b for b in bodies if "You are the seller" in b]
    buyer = [b for b in bodies if "You are the buyer" in b]
    assert len(seller) + len(buyer) == len(bodies) and len(buyer) >= 10
    assert all(canary in b for b in seller) and not any(canary in b for b in buyer)


def played(results) -> list:
    """What a run decided, without timings: each negotiation's outcome, tokens, and every turn's action and feedback."""
    out = []
    for r in results:
        turns = [(t.action.kind, t.action.offer, t.action.message, t.action.raw, t.valid, t.feedback) for t in r.turns]
        tokens = [(u.prompt_tokens, u.completion_tokens, u.calls) for u in (r.usage_seller, r.usage_buyer)]
        out.append((r.outcome, tokens, turns))
    return out


@pytest.mark.parametrize("tools", [True, False])
async def test_both_openai_clients_play_the_same_negotiations_to_the_same_transcripts(tools):
    control = Control(faults=deque(FAULTS[:12]))
    runs, bodies = [], []
    async with serve(BRAIN, control) as srv:
        for client in ("sdk", "lean"):
            control.faults = deque(FAULTS[:12])
            srv.requests.clear()
            settings = LLMSettings(base_url=srv.openai_url, policy=FAST, tools=tools, client=client)
            jobs = [Job(make_widget_scenario(), "openai:m", "openai:m", seed) for seed in range(4)]
            runs.append(played(await play(jobs, settings, concurrency=1)))
            bodies.append([r.body for r in srv.requests])
    assert runs[0] == runs[1] and bodies[0] == bodies[1] and len(bodies[0]) > 12
