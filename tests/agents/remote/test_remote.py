"""Remote agents on loopback: a full negotiation through the server, auth, limits, failures, isolation."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading

import aiohttp
import pytest
import typer
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents.remote.client import RemoteAgentError, RemoteFactory, decode_reply
from nego.agents.remote.server import make_app, start
from nego.agents.remote.wire import WIRE_VERSION, action_to_dict, observation_to_dict
from nego.market.protocol import NegotiatorError, run_negotiation
from nego.market.types import Action, ActionKind, EndReason, Observation
from nego.scenarios.scenario import Role

from ...conftest import make_widget_scenario

TOKEN = "t0ken-for-tests"


class Stepper:
    """A small stateful agent: walks down its own outcomes best-first, one per turn, and accepts any standing
    offer worth at least what it would offer next. Remembers its step count between turns (so a server that
    rebuilt it every request would play differently) and every scenario view object it was handed."""

    def __init__(self, role: Role, seed: int) -> None:
        self.role, self.seed, self.step = role, seed, 0
        self.view_ids: set[int] = set()

    async def act(self, obs: Observation) -> Action:
        self.view_ids.add(id(obs.scenario))
        view = obs.scenario
        grid = [
            {"price": p, "quantity": q, "warranty": w}
            for p in (150, 120, 100, 80)
            for q in (10, 5)
            for w in ("none", "1y", "2y")
        ]
        ranked = sorted(grid, key=lambda o: (-view.utility(o), sorted(o.items())))
        target = ranked[min(self.step * (1 + self.seed % 3), len(ranked) - 1)]
        self.step += 1
        if obs.standing_offer is not None and view.utility(obs.standing_offer) >= view.utility(target):
            return Action.accept("deal")
        return Action.make_offer(target, f"step {self.step}")


class StepperFactory:
    spec = "test:stepper"
    kind = "rule"

    def __init__(self) -> None:
        self.built: list[Stepper] = []

    def __call__(self, role: Role, seed: int) -> Stepper:
        self.built.append(Stepper(role, seed))
        return self.built[-1]


@pytest.fixture
async def served():
    """Start a server for a factory; yield (url, factory); stop every server at the end."""
    runners = []

    async def serve(factory=None, **kw):
        factory = factory or StepperFactory()
        runner, url = await start(make_app(factory, TOKEN, **kw))
        runners.append(runner)
        return url, factory

    yield serve
    for runner in runners:
        await runner.cleanup()


async def serve_raw(handler) -> tuple[web.AppRunner, str]:
    """A fake agent server whose /act handler is ``handler`` (for replies a real server never sends)."""
    app = web.Application()
    app.router.add_post("/act", handler)
    return await start(app)


async def remote_seller_against(handler, seller_seed: int = 4, **options):
    """The result of a widget negotiation whose seller is a remote agent served by ``handler`` (no backoff unless
    ``options`` set one), against an in-process stepping buyer."""
    runner, url = await serve_raw(handler)
    remote = RemoteFactory(url, token=TOKEN, **{"backoff_s": 0, **options})
    try:
        return await run_negotiation(make_widget_scenario(), remote(Role.SELLER, seller_seed), Stepper(Role.BUYER, 0))
    finally:
        await remote.aclose()
        await runner.cleanup()


def summary(result):
    return result.outcome, [(t.role, t.action.kind, t.action.offer, t.action.message, t.valid) for t in result.turns]


async def test_whole_negotiation_through_the_server_matches_in_process_play(served):
    url, served_factory = await served()
    scenario = make_widget_scenario(max_rounds=8)
    local = await run_negotiation(scenario, Stepper(Role.SELLER, 1), Stepper(Role.BUYER, 2), seed=5)
    remote = RemoteFactory(url, token=TOKEN, backoff_s=0)
    try:
        both_remote = await run_negotiation(scenario, remote(Role.SELLER, 1), remote(Role.BUYER, 2), seed=5)
        mixed = await run_negotiation(scenario, remote(Role.SELLER, 1), Stepper(Role.BUYER, 2), seed=5)
    finally:
        await remote.aclose()
    assert local.outcome.end_reason is EndReason.AGREEMENT and len(local.turns) > 4
    assert summary(both_remote) == summary(local)
    assert summary(mixed) == summary(local)
    # one instance per (negotiation, role), built with the caller's seed, handed one view object throughout
    assert [(a.role, a.seed) for a in served_factory.built] == [(Role.SELLER, 1), (Role.BUYER, 2), (Role.SELLER, 1)]
    assert all(len(a.view_ids) == 1 and a.step > 1 for a in served_factory.built)
    assert both_remote.usage_seller.latency_s > 0


async def test_wrong_or_missing_token_is_401_and_ends_the_negotiation_without_retries(served):
    url, factory = await served()
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
            async with http.post(f"{url}/act", json={}, headers=headers) as resp:
                assert resp.status == 401
                assert "bearer token" in (await resp.json())["error"]
        async with http.get(f"{url}/health") as resp:
            assert (await resp.json()) == {"ok": True}  # what is served is told to token holders only
        async with http.get(f"{url}/health", headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert (await resp.json()) == {"ok": True, "v": WIRE_VERSION, "agent": "test:stepper"}
    remote = RemoteFactory(url, token="wrong", retries=3, backoff_s=0)
    result = await run_negotiation(make_widget_scenario(), remote(Role.SELLER, 0), Stepper(Role.BUYER, 0))
    await remote.aclose()
    assert result.outcome.end_reason is EndReason.ERROR and "HTTP 401" in result.outcome.error
    assert result.turns == () and factory.built == []


async def test_oversized_body_is_413(served):
    url, _ = await served(max_body_bytes=300)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        async with http.post(f"{url}/act", data=b"x" * 301) as resp:
            assert resp.status == 413
        chunks = (b"y" * 100 for _ in range(5))  # no Content-Length: the limit holds while reading
        async with http.post(f"{url}/act", data=_aiter(chunks)) as resp:
            assert resp.status == 413
    remote = RemoteFactory(url, token=TOKEN, backoff_s=0)
    result = await run_negotiation(make_widget_scenario(), remote(Role.SELLER, 0), Stepper(Role.BUYER, 0))
    await remote.aclose()
    assert result.outcome.end_reason is EndReason.ERROR and "HTTP 413" in result.outcome.error


async def _aiter(items):
    for item in items:
        yield item


async def test_malformed_requests_get_400_with_the_reason(served):
    url, _ = await served()
    obs = observation_to_dict(Observation(make_widget_scenario().view_for(Role.SELLER), (), 1, None))
    good = {"v": WIRE_VERSION, "negotiation_id": "n1", "seed": 3, "observation": obs}
    cases = [
        (b"{not json", "malformed JSON"),
        (json.dumps({**good, "seed": "3"}).encode(), "body.seed: expected an integer"),
        (json.dumps({**good, "negotiation_id": ""}).encode(), "body.negotiation_id"),
        (json.dumps({**good, "observation": {**obs, "round": 0}}).encode(), "observation.round: must be >= 1"),
        (json.dumps({**good, "v": 2}).encode(), "body.v: unsupported wire version 2"),
    ]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        for data, reason in cases:
            async with http.post(f"{url}/act", data=data) as resp:
                assert resp.status == 400
                assert reason in (await resp.json())["error"]
        async with http.post(f"{url}/act", json=good) as first, http.post(f"{url}/act", json=good) as again:
            # a retried request is answered from the session, without advancing the agent a second time
            assert first.status == again.status == 200
            assert (await first.json()) == (await again.json())


async def test_slow_agent_is_504_and_failing_agent_is_500_then_an_error_outcome(served):
    class Slow(StepperFactory):
        def __call__(self, role, seed):
            class Agent:
                async def act(self, obs):
                    await asyncio.sleep(30)

            return Agent()

    class Failing(StepperFactory):
        def __call__(self, role, seed):
            class Agent:
                async def act(self, obs):
                    raise RuntimeError("model crashed")

            return Agent()

    for factory, status in ((Slow(), "HTTP 504"), (Failing(), "HTTP 500: the agent failed: RuntimeError")):
        url, _ = await served(factory, timeout_s=0.05)
        remote = RemoteFactory(url, token=TOKEN, retries=1, backoff_s=0)
        result = await run_negotiation(make_widget_scenario(), remote(Role.SELLER, 0), Stepper(Role.BUYER, 0))
        await remote.aclose()
        assert result.outcome.end_reason is EndReason.ERROR
        assert "failed after 2 attempts" in result.outcome.error and status in result.outcome.error


async def test_server_down_ends_the_negotiation_as_an_error_after_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = RemoteFactory(f"http://127.0.0.1:{port}", token=TOKEN, retries=2, backoff_s=0.001)
    result = await run_negotiation(make_widget_scenario(), remote(Role.SELLER, 0), Stepper(Role.BUYER, 0))
    await remote.aclose()
    assert result.outcome.end_reason is EndReason.ERROR and result.outcome.ended_by is Role.SELLER
    assert "failed after 3 attempts" in result.outcome.error and "Connect" in result.outcome.error


async def test_malformed_replies_count_as_invalid_actions_with_feedback():
    bodies: list[dict] = []
    replies = [
        (200, "this is not json"),
        (200, json.dumps({"action": {"v": WIRE_VERSION, "kind": "bid"}})),
        (503, "overloaded"),  # retried, not counted
        (200, json.dumps({"v": WIRE_VERSION, "action": action_to_dict(Action.walk_away("bye"))})),
    ]

    async def handler(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        status, text = replies.pop(0)
        return web.Response(status=status, text=text)

    result = await remote_seller_against(handler)
    assert result.outcome.end_reason is EndReason.WALK_AWAY and result.outcome.invalid_seller == 2
    first, second = result.turns[:2]
    assert first.action.kind is ActionKind.INVALID and first.action.raw == "this is not json"
    assert "not valid JSON" in first.feedback and not first.valid
    assert "action.kind: must be one of" in second.feedback
    # the agent is told what was wrong with its previous reply, and the retry keeps the negotiation's id
    assert [b["observation"]["attempt"] for b in bodies] == [0, 1, 2, 2]
    assert "not valid JSON" in bodies[1]["observation"]["feedback"]
    assert len({b["negotiation_id"] for b in bodies}) == 1 and bodies[0]["seed"] == 4


async def test_the_remote_side_receives_only_its_own_observation():
    scenario = make_widget_scenario(seller_brief="CANARY-SELLER-5521", buyer_brief="CANARY-BUYER-8802")
    bodies: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        bodies.append(await request.text())
        obs = json.loads(bodies[-1])["observation"]
        action = (
            Action.accept()
            if obs["standing_offer"]
            else Action.make_offer({"price": 90, "quantity": 5, "warranty": "2y"})
        )
        return web.json_response({"v": WIRE_VERSION, "action": action_to_dict(action)})

    runner, url = await serve_raw(handler)
    remote = RemoteFactory(url, token=TOKEN)
    try:
        result = await run_negotiation(scenario, Stepper(Role.SELLER, 0), remote(Role.BUYER, 0))
    finally:
        await remote.aclose()
        await runner.cleanup()
    assert result.outcome.agreed and bodies
    seller_view = json.dumps(observation_to_dict(Observation(scenario.view_for(Role.SELLER), (), 1, None))["scenario"])
    for body in bodies:
        assert "CANARY-SELLER" not in body and "CANARY-BUYER-8802" in body
        sent = json.loads(body)["observation"]["scenario"]
        assert sent["role"] == "buyer" and sent["preferences"]["values"]["warranty"] == {
            "none": 0.0,
            "1y": 0.6,
            "2y": 1.0,
        }
        assert json.dumps(sent) != seller_view


async def test_stale_sessions_are_dropped_least_recently_used_first(served):
    url, factory = await served(max_sessions=2)
    remote = RemoteFactory(url, token=TOKEN)
    obs = Observation(make_widget_scenario().view_for(Role.SELLER), (), 1, None)
    agents = [remote(Role.SELLER, 0) for _ in range(3)]
    try:
        for agent in (*agents, agents[0]):
            await agent.act(obs)
    finally:
        await remote.aclose()
    assert len(factory.built) == 4  # the first negotiation's session was evicted by the third, then rebuilt


def test_decode_reply_and_factory_arguments():
    assert decode_reply('{"v": 1, "action": {"v": 1, "kind": "accept"}}', 0.25).usage.latency_s == 0.25
    assert decode_reply("[]").kind is ActionKind.INVALID
    factory = RemoteFactory("http://example.invalid:9/", token="secret")
    assert factory.spec == "remote:http://example.invalid:9" and factory.kind == "remote"
    assert "secret" not in repr(factory)
    with pytest.raises(ValueError, match="http://host:port"):
        RemoteFactory("example.com:80")
    assert issubclass(RemoteAgentError, NegotiatorError)  # so the protocol ends the negotiation as an error


async def test_serve_agent_serves_a_registry_spec_that_plays_like_in_process():
    from nego.agents.registry import resolve
    from nego.cli.serve_cmd import run_server

    factory = resolve("tft")
    stop, ready = asyncio.Event(), asyncio.Queue()
    server = asyncio.create_task(run_server(factory, TOKEN, on_ready=ready.put_nowait, stop=stop))
    url = await asyncio.wait_for(ready.get(), 10)
    remote = RemoteFactory(url, token=TOKEN)
    scenario = make_widget_scenario(max_rounds=10)
    buyer = resolve("boulware")
    try:
        played = await run_negotiation(scenario, remote(Role.SELLER, 3), buyer(Role.BUYER, 4), seed=1)
    finally:
        await remote.aclose()
        stop.set()
        await server
    local = await run_negotiation(scenario, factory(Role.SELLER, 3), buyer(Role.BUYER, 4), seed=1)
    assert len(local.turns) > 4 and summary(played) == summary(local)


def test_serve_agent_command_refuses_a_spec_it_cannot_play(monkeypatch):
    from nego.cli.serve_cmd import serve_agent
    from typer.testing import CliRunner

    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    app = typer.Typer()
    app.command()(serve_agent)
    cases = [
        (["no-such-agent"], "unknown negotiator spec"),
        (["openai:gpt-5-mini"], "export OPENAI_API_KEY"),
        (["vllm:m@http://127.0.0.1:9", "--template", "no-such-template"], "neither a built-in template"),
        (["tft", "--token", "has a space"], "printable ASCII without spaces"),
        (["tft", "--read-timeout-s", "0"], "--read-timeout-s and --max-connections must be positive"),
    ]
    for args, reason in cases:
        result = CliRunner().invoke(app, [*args, "--port", "0"])
        text = re.sub(r"[\s│]+", " ", result.output)  # the error box wraps and frames the message
        assert result.exit_code == 2 and reason in text, result.output


async def test_serve_agent_command_prints_a_token_serves_health_and_plays(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NEGO_AGENT_TOKEN"}
    cmd = [sys.executable, "-m", "nego.cli.app", "serve-agent", "tft", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        said = [lines.get(timeout=60) for _ in range(3)]
        url = re.search(r"serving tft at (http://127\.0\.0\.1:\d+) ", said[0]).group(1)
        token = re.fullmatch(r"token: (\S+)  \(clients: export NEGO_AGENT_TOKEN=(\S+)\)\n", said[1]).group(1)
        assert len(token) >= 24 and f"remote:{url}" in said[2]
        auth = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as http, http.get(f"{url}/health", headers=auth) as resp:
            assert (await resp.json())["agent"] == "tft"
        wrong = RemoteFactory(url, token=token + "x", backoff_s=0)
        right = RemoteFactory(url, token=token, backoff_s=0)
        try:
            refused = await run_negotiation(make_widget_scenario(), wrong(Role.SELLER, 0), Stepper(Role.BUYER, 0))
            played = await run_negotiation(make_widget_scenario(), right(Role.SELLER, 0), Stepper(Role.BUYER, 0))
        finally:
            await wrong.aclose()
            await right.aclose()
        assert "HTTP 401" in refused.outcome.error
        assert played.outcome.end_reason is not EndReason.ERROR and len(played.turns) >= 2
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0  # SIGTERM stops it cleanly


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=300)
    | st.sampled_from(
        ['{"action": ', '{"v": 1, "action": {"v": 1, "kind": "offer", "offer": {"p": ', "[", "9"]
    ).flatmap(lambda head: st.tuples(st.just(head), st.text(max_size=50)).map("".join))
)
def test_decode_reply_turns_any_text_into_an_action(text):
    action = decode_reply(text)
    assert isinstance(action, Action)
    if action.kind is ActionKind.INVALID:
        assert action.error.startswith("the remote agent's reply")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
        ('{"v": 1, "action": {"v": 1, "kind": "offer", "offer": {"price": ' + "9" * 5000 + "}}}", "5,000 digits"),
        ('{"v": 1, "action": {"v": 1, "kind": "offer", "offer": {"price": 1e999}}}', "out of range"),
        ('{"v": 1, "action": {"v": 1, "kind": "offer", "offer": {"price": NaN}}}', "NaN is not a JSON number"),
    ],
    ids=["nesting-bomb", "huge-int", "overflow", "nan"],
)
def test_a_hostile_reply_is_an_invalid_action_with_the_reason(text, reason):
    action = decode_reply(text)
    assert action.kind is ActionKind.INVALID and reason in action.error
    assert len(action.raw) <= 4000


async def test_oversized_or_hostile_error_replies_end_the_negotiation_as_an_error():
    from nego.agents.remote import client as remote_module

    replies = [
        (200, "x" * (remote_module.MAX_REPLY_BYTES + 1), "sent a reply larger than"),
        (400, "[" * 100_000 + "]" * 100_000, "refused the request (HTTP 400: [[[["),
        (400, '{"error": ' + "9" * 5000 + "}", 'refused the request (HTTP 400: {"error": 999'),
    ]
    for status, text, reason in replies:

        async def handler(request: web.Request, status=status, text=text) -> web.Response:
            return web.Response(status=status, text=text)

        result = await remote_seller_against(handler, seller_seed=0)
        assert result.outcome.end_reason is EndReason.ERROR and reason in result.outcome.error


async def test_a_server_that_will_never_serve_the_request_is_asked_once():
    calls = []

    async def handler(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.Response(status=501, text="Not Implemented")

    result = await remote_seller_against(handler, retries=2)
    assert result.outcome.end_reason is EndReason.ERROR
    assert "refused the request (HTTP 501: Not Implemented)" in result.outcome.error
    assert calls == ["/act"]


async def test_a_server_that_echoes_the_token_never_gets_it_into_moves_or_errors(monkeypatch):
    monkeypatch.setenv("NEGO_AGENT_TOKEN", TOKEN)
    replies = [
        (200, json.dumps({"v": WIRE_VERSION, "action": action_to_dict(Action.make_offer({}, f"token {TOKEN}"))})),
        (200, json.dumps({"v": WIRE_VERSION, "action": action_to_dict(Action.walk_away(f"bye {TOKEN}"))})),
    ]

    async def handler(request: web.Request) -> web.Response:
        status, text = replies.pop(0)
        return web.Response(status=status, text=text)

    result = await remote_seller_against(handler)
    texts = [f"{t.action.message} {t.action.raw} {t.action.error} {t.feedback}" for t in result.turns]
    assert all(TOKEN not in text for text in texts) and any("[redacted:NEGO_AGENT_TOKEN]" in t for t in texts)

    async def failing(request: web.Request) -> web.Response:
        return web.Response(status=401, text=f"bad token {TOKEN}")

    result = await remote_seller_against(failing, retries=0)
    assert result.outcome.end_reason is EndReason.ERROR and TOKEN not in result.outcome.error
