"""OpenAI and Anthropic backends end to end against the loopback fake server: through the real SDKs, and the
OpenAI wire format through the lean client ("openai-lean")."""

from __future__ import annotations

import logging

import pytest
from nego.agents.llm.backends.anthropic_backend import AnthropicBackend
from nego.agents.llm.backends.base import BackendError, ChatMessage, ChatRequest
from nego.agents.llm.backends.limits import MalformedResponse, Price, PriceTable, RetryPolicy
from nego.agents.llm.backends.openai_backend import OpenAIBackend
from nego.agents.llm.backends.openai_lean import MAX_REPLY_BYTES, LeanOpenAIBackend
from nego.agents.llm.parsing import action_tools, parse_response
from nego.market.types import Action, ActionKind

from ...conftest import make_widget_scenario
from ...fakes.llm_server import Fault, serve

CANARY_KEY = "sk-test-CANARY-5f1e0c"
OFFER = {"price": 120, "quantity": 4, "warranty": "1y"}
ISSUES = make_widget_scenario().issues
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.001, max_delay_s=0.01, max_retry_after_s=1.0, timeout_s=5.0)


@pytest.fixture
async def server():
    async with serve(lambda messages: Action.make_offer(OFFER, "hi")) as srv:
        srv.backends = []
        yield srv
        for backend in srv.backends:
            await backend.aclose()


def make_backend(kind: str, srv, policy: RetryPolicy = FAST, **kw):
    if kind.startswith("openai"):
        cls = LeanOpenAIBackend if kind == "openai-lean" else OpenAIBackend
        backend = cls("gpt-fake", base_url=srv.openai_url, api_key=CANARY_KEY, policy=policy, **kw)
    else:
        backend = AnthropicBackend("claude-fake", base_url=srv.anthropic_url, api_key=CANARY_KEY, policy=policy, **kw)
    srv.backends.append(backend)
    return backend


def request(tools: bool) -> ChatRequest:
    msgs = (ChatMessage("system", "You are the seller."), ChatMessage("user", "Round 1 of 6."))
    return ChatRequest(msgs, tools=action_tools(ISSUES) if tools else (), max_tokens=64, temperature=0.2, seed=7)


BOTH = pytest.mark.parametrize("kind", ["openai", "openai-lean", "anthropic"])
OPENAI = pytest.mark.parametrize("kind", ["openai", "openai-lean"])


@BOTH
@pytest.mark.parametrize("tools", [True, False])
async def test_reply_round_trips_to_the_action(server, kind, tools):
    backend = make_backend(kind, server, prices=PriceTable({"gpt-fake": Price(1.0, 2.0), "claude-fake": Price(1, 2)}))
    reply = await backend.complete(request(tools))
    await backend.aclose()
    assert bool(reply.tool_calls) is tools
    action = parse_response(reply, ISSUES)
    assert action.kind is ActionKind.OFFER and action.offer == OFFER and action.message == "hi"
    u = reply.usage
    assert u.calls == 1 and u.prompt_tokens > 0 and u.completion_tokens > 0
    assert u.cost_usd == pytest.approx((u.prompt_tokens + 2 * u.completion_tokens) / 1e6)
    body = server.requests[-1].body
    if kind.startswith("openai"):
        assert body["seed"] == 7 and body["messages"][0]["role"] == "system" and body["max_completion_tokens"] == 64
        assert (body["tools"][0]["function"]["name"] if tools else None) == ("make_offer" if tools else None)
    else:
        assert body["system"] == "You are the seller." and body["max_tokens"] == 64
        assert [m["role"] for m in body["messages"]] == ["user"]
        assert (body["tools"][0]["input_schema"]["required"] if tools else None) == (
            ["price", "quantity", "warranty"] if tools else None
        )


@BOTH
async def test_transient_errors_are_retried(server, kind):
    backend = make_backend(kind, server)
    for status, retry_after in [(429, "0.01"), (429, None), (500, None), (503, "0"), (408, None)]:
        server.requests.clear()
        server.control.fail(FAST.max_attempts - 1, status, retry_after)
        reply = await backend.complete(request(True))
        assert parse_response(reply, ISSUES).kind is ActionKind.OFFER
        assert len(server.requests) == FAST.max_attempts
    await backend.aclose()


@BOTH
async def test_malformed_replies_are_retried_then_given_up(server, kind):
    backend = make_backend(kind, server)
    for mode in ("truncated", "empty_choices", "missing_field"):
        server.requests.clear()
        server.control.corrupt(1, mode)
        reply = await backend.complete(request(True))
        assert parse_response(reply, ISSUES).kind is ActionKind.OFFER and len(server.requests) == 2
        server.control.corrupt(FAST.max_attempts, mode)
        with pytest.raises(BackendError, match=f"gave up after {FAST.max_attempts} tries"):
            await backend.complete(request(True))
    await backend.aclose()


@BOTH
async def test_persistent_failures_and_long_retry_after_raise_backend_error(server, kind):
    server.control.fail(FAST.max_attempts, 500)
    with pytest.raises(BackendError, match="HTTP 500"):
        await make_backend(kind, server).complete(request(False))
    server.control.faults.clear()
    server.control.fail(1, 429, "300")
    with pytest.raises(BackendError, match="asked to wait 300 s"):
        await make_backend(kind, server).complete(request(False))
    n = len(server.requests)
    server.control.fail(1, 400)
    with pytest.raises(BackendError, match="HTTP 400"):
        await make_backend(kind, server).complete(request(False))
    assert len(server.requests) == n + 1  # a client error is not retried


@BOTH
async def test_timeouts_are_retried_then_given_up(server, kind):
    server.control.latency_s = 3.0  # far past the timeout, which leaves a busy machine time to send the request
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.001, timeout_s=0.5)
    with pytest.raises(BackendError, match=r"no reply within 0\.5 s"):
        await make_backend(kind, server, policy=policy).complete(request(True))
    assert len(server.requests) == 2


@BOTH
async def test_wrong_typed_tool_arguments_reach_the_parser_as_an_invalid_action(server, kind):
    server.control.corrupt(1, "wrong_types")
    reply = await make_backend(kind, server).complete(request(True))
    action = parse_response(reply, ISSUES)
    assert action.kind is ActionKind.INVALID and "price must be a number" in action.error


@BOTH
@pytest.mark.parametrize("tools", [True, False])
async def test_a_reply_cut_at_max_tokens_is_an_invalid_action_that_says_so(server, kind, tools):
    server.control.corrupt(1, "length")
    reply = await make_backend(kind, server).complete(request(tools))
    action = parse_response(reply, ISSUES)
    assert reply.truncated and action.kind is ActionKind.INVALID
    assert "cut off at the length limit" in action.error and "no action found" in action.error
    assert not (await make_backend(kind, server).complete(request(tools))).truncated


@BOTH
async def test_api_key_never_leaks(server, kind, caplog):
    caplog.set_level(logging.DEBUG)
    backend = make_backend(kind, server)
    assert CANARY_KEY not in repr(backend) and CANARY_KEY not in str(vars(backend))
    server.control.fail(1, 503)
    server.control.corrupt(1, "echo_key")
    with pytest.raises(BackendError) as err:
        await backend.complete(request(True))
    assert "invalid credential" in str(err.value) and CANARY_KEY not in str(err.value)
    assert CANARY_KEY in str(server.requests[-1].headers)  # the key did travel, and the server echoed it
    assert all(CANARY_KEY not in r.getMessage() for r in caplog.records)
    await backend.aclose()


@OPENAI
async def test_backend_survives_a_change_of_event_loop(server, kind):
    backend = make_backend(kind, server)
    await backend.complete(request(False))
    await backend.aclose()  # closed, or on a fresh event loop: the next call builds a new client
    assert (await backend.complete(request(False))).usage.calls == 1


@OPENAI
async def test_openai_temperature_is_sent_only_when_set(server, kind):
    """Reasoning models reject any temperature but their default, so none is sent unless the user asks."""
    backend = make_backend(kind, server)
    msgs = (ChatMessage("system", "You are the seller."), ChatMessage("user", "Round 1 of 6."))
    await backend.complete(ChatRequest(msgs, max_tokens=64))
    assert "temperature" not in server.requests[-1].body
    await backend.complete(ChatRequest(msgs, max_tokens=64, temperature=0.3))
    assert server.requests[-1].body["temperature"] == 0.3


async def test_an_empty_earlier_message_reaches_the_messages_api_as_text(server):
    """A conversation can hold an empty reply (a model that wrote nothing, a withheld invalid one); the Messages API
    refuses empty earlier messages, so it is sent as a short text."""
    from nego.agents.llm.backends.anthropic_backend import EMPTY_TURN

    msgs = (
        ChatMessage("system", "You are the seller."),
        ChatMessage("user", "Round 1 of 6."),
        ChatMessage("assistant", ""),
        ChatMessage("user", "Your previous reply was not a valid move."),
    )
    await make_backend("anthropic", server).complete(ChatRequest(msgs, max_tokens=64))
    sent = server.requests[-1].body["messages"]
    assert [m["content"] for m in sent] == ["Round 1 of 6.", EMPTY_TURN, "Your previous reply was not a valid move."]


async def test_the_lean_client_sends_what_the_sdk_sends(server):
    for kind in ("openai", "openai-lean"):
        await make_backend(kind, server).complete(request(True))
    sdk, lean = server.requests[-2:]
    assert lean.body == sdk.body and lean.path == sdk.path
    assert lean.headers["Authorization"] == sdk.headers["Authorization"] == f"Bearer {CANARY_KEY}"
    assert lean.headers["Content-Type"] == sdk.headers["Content-Type"] == "application/json"


async def test_the_lean_client_refuses_a_reply_over_the_cap_without_retrying(server):
    backend = make_backend("openai-lean", server)
    server.control.faults.append(Fault(text="x" * MAX_REPLY_BYTES))
    with pytest.raises(BackendError, match=rf"refused reply: the reply body is \d+ bytes, over {MAX_REPLY_BYTES}"):
        await backend.complete(request(False))
    assert len(server.requests) == 1
    server.control.faults.append(Fault(text="x" * (MAX_REPLY_BYTES // 2)))  # under the cap: read as any reply
    assert (await backend.complete(request(False))).text == "x" * (MAX_REPLY_BYTES // 2)
    await backend.aclose()


async def test_the_lean_client_validates_replies_and_counts_those_without_usage(server):
    backend = make_backend("openai-lean", server)
    reply = backend._validate({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})
    assert reply.text == "hi" and reply.usage.prompt_tokens == 0 and backend.missing_usage == 1
    for bad in ({}, {"choices": []}, {"choices": [{}]}, {"choices": [{"message": {"content": 3}}]},
                {"choices": [{"message": {"tool_calls": [{"function": {"name": "accept"}}]}}]}):  # fmt: skip
        with pytest.raises(MalformedResponse):
            backend._validate(bad)
