"""The agent server under hostile clients, on loopback: bad headers and bodies get a 4xx without a traceback,
oversized observations are refused before any agent runs, slow or idle connections are closed, and /health keeps
answering while many connections sit idle."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import aiohttp
import pytest
from nego.agents.remote.server import bind_warnings, check_token, make_app, start
from nego.agents.remote.wire import WIRE_VERSION, observation_to_dict
from nego.market.types import Observation
from nego.scenarios.scenario import Role

from ...conftest import make_widget_scenario
from .test_remote import TOKEN, StepperFactory

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def server():
    """Start an agent server with the given ``make_app`` options; yield (url, factory); stop them all at the end."""
    running = []

    async def serve(factory=None, **kw):
        factory = factory or StepperFactory()
        handle, url = await start(make_app(factory, TOKEN, **kw))
        running.append(handle)
        return url, factory

    yield serve
    for handle in running:
        await handle.cleanup()


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    return await asyncio.open_connection(parts.hostname, parts.port)


async def raw_request(url: str, data: bytes) -> tuple[int, bytes]:
    """Send ``data`` as it is on a fresh connection; return the status code and the whole answer."""
    reader, writer = await connect(url)
    writer.write(data)
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return int(answer.split(b" ", 2)[1]), answer


def act_body(observation: dict) -> dict:
    return {"v": WIRE_VERSION, "negotiation_id": "n1", "seed": 0, "observation": observation}


def good_observation() -> dict:
    return observation_to_dict(Observation(make_widget_scenario().view_for(Role.SELLER), (), 1, None))


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> bool:
    return all(r.exc_info is None and r.levelno < logging.ERROR for r in caplog.records)


async def test_a_non_ascii_authorization_header_is_401_without_a_traceback(server, caplog):
    url, factory = await server()
    head = "POST /act HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0ken-ünïcode\r\nContent-Length: 2\r\n"
    status, _ = await raw_request(url, head.encode("utf-8") + b"Connection: close\r\n\r\n{}")
    assert status == 401 and factory.built == []
    latin1 = b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\nConnection: close\r\n\r\n"
    status, answer = await raw_request(url, latin1)
    assert status == 200 and answer.endswith(b'{"ok": true}')
    assert no_tracebacks(caplog)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"v": 1, "seed": ' + b"9" * 5000 + b"}", "body.seed: an integer of 5,000 digits"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than"),
        (b'{"observation": {"deep": ' + b"[" * 33 + b"]" * 33 + b"}}", "body.observation.deep[0][0]"),
        (b'{"v": 1, "seed": NaN}', "body.seed: NaN is not a JSON number"),
        (b'{"v": 1, "seed": 1e999}', "body.seed: the number 1e999 is out of range"),
        (b'{"v": 1, "negotiation_id": "\xff"}', "not UTF-8 text"),
    ],
    ids=["5000-digit-int", "nesting-bomb", "nesting-33", "nan", "overflow", "bad-utf8"],
)
async def test_hostile_bodies_are_400_with_the_reason_and_no_traceback(server, caplog, body, reason):
    url, factory = await server()
    async with aiohttp.ClientSession(headers=AUTH) as http, http.post(f"{url}/act", data=body) as resp:
        assert resp.status == 400
        assert reason in (await resp.json())["error"]
    assert factory.built == [] and no_tracebacks(caplog)


async def test_a_10_kb_header_is_a_4xx_and_one_log_line_without_a_traceback(server, caplog):
    url, _ = await server()
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 10_000 + b"\r\nConnection: close\r\n\r\n"
    with caplog.at_level(logging.WARNING):
        status, _ = await raw_request(url, head)
    assert 400 <= status < 500
    assert no_tracebacks(caplog) and any("malformed request" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("issue", "reason"),
    [
        ({"name": "price", "kind": "int", "low": 0, "high": 10_000_000, "step": 1}, "10,000,001 points"),
        ({"name": "price", "kind": "float", "low": 0.0, "high": 1.0, "step": 1e-8}, "100,000,001 points"),
        ({"name": "price", "kind": "float", "low": 0.0, "high": 1.0, "step": 1e-320}, "finer than"),
        ({"name": "price", "kind": "int", "low": -(10**18), "high": 10**18}, "beyond the limit"),
    ],
    ids=["int-1e7", "float-step-1e-8", "denormal-step", "huge-bounds"],
)
async def test_an_observation_past_the_scenario_limits_is_400_before_any_agent_runs(server, issue, reason):
    url, factory = await server()
    obs = good_observation()
    obs["scenario"]["issues"][0] = {**obs["scenario"]["issues"][0], **issue}
    async with aiohttp.ClientSession(headers=AUTH) as http, http.post(f"{url}/act", json=act_body(obs)) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error.startswith("observation.scenario.issues[0]: issue 'price'") and reason in error
    assert factory.built == []


async def test_too_many_outcomes_or_rounds_are_400(server):
    url, factory = await server()
    many = good_observation()
    many["scenario"]["issues"][0].update(low=0, high=9_995, step=5)  # 2,000 points x 10 x 3 = 60,000: fine
    many["scenario"]["issues"][1].update(low=1, high=1_000)  # x 100 = 6,000,000: too many
    long = good_observation()
    long["scenario"]["max_rounds"] = 10**6
    cases = [(many, "observation.scenario.issues: the outcome grid has 6,000,000 outcomes (limit 1,000,000)")]
    cases.append((long, "observation.scenario.max_rounds: must lie in 1..1000, got 1000000"))
    async with aiohttp.ClientSession(headers=AUTH) as http:
        for obs, reason in cases:
            async with http.post(f"{url}/act", json=act_body(obs)) as resp:
                assert resp.status == 400 and reason in (await resp.json())["error"]
    assert factory.built == []


async def test_half_sent_requests_are_closed_after_the_read_timeout(server):
    url, _ = await server(read_timeout_s=0.5)
    idle = [await connect(url) for _ in range(3)]
    for _, writer in idle[:2]:
        writer.write(b"POST /act HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    for reader, writer in idle:
        assert await asyncio.wait_for(reader.read(), 30) == b""  # the server hung up
        writer.close()
    head = f"POST /act HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n"
    status, answer = await raw_request(url, head.encode() + b'{"v": 1')  # the body stops a tenth of the way
    assert status == 408 and b"did not arrive within 0.5 s" in answer


async def test_health_answers_while_50_half_open_connections_sit_idle(server):
    url, _ = await server(max_connections=20, read_timeout_s=60)
    idle = [await connect(url) for _ in range(50)]
    for _, writer in idle:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.get(f"{url}/health") as resp:
                assert resp.status == 200 and await resp.json() == {"ok": True}
    for reader, _ in idle[:30]:  # the oldest idle ones made room (the read timeout is far away)
        assert await asyncio.wait_for(reader.read(), 30) == b""
    for _, writer in idle:
        writer.close()


class Blocking(StepperFactory):
    """Agents that hold their request open until released, and say when they started."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Queue()
        self.release = asyncio.Event()

    def __call__(self, role, seed):
        factory = self

        class Agent:
            async def act(self, obs):
                factory.started.put_nowait(seed)
                await factory.release.wait()

        return Agent()


async def test_a_server_full_of_requests_in_progress_answers_503_and_recovers(server):
    factory = Blocking()
    url, _ = await server(factory, max_connections=4, timeout_s=60)
    body = act_body(good_observation())
    async with aiohttp.ClientSession(headers=AUTH) as http:
        calls = [
            asyncio.create_task(http.post(f"{url}/act", json={**body, "negotiation_id": f"n{k}", "seed": k}))
            for k in range(4)
        ]
        assert sorted([await asyncio.wait_for(factory.started.get(), 30) for _ in range(4)]) == [0, 1, 2, 3]
        status, answer = await raw_request(url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503 and b"connection limit" in answer
        factory.release.set()
        for call in calls:
            (await call).release()
        async with http.get(f"{url}/health") as resp:
            assert resp.status == 200


def test_bind_warnings_on_loopback_and_beyond():
    assert bind_warnings("127.0.0.1", "short") == bind_warnings("::1", "") == bind_warnings("localhost", "x") == []
    long = "k" * 32
    assert len(bind_warnings("0.0.0.0", long)) == 1 and "plain HTTP" in bind_warnings("0.0.0.0", long)[0]
    assert "has 5 characters" in bind_warnings("192.168.1.4", "short")[1]
    assert "no token was given" in bind_warnings("", long, generated=True)[1]
    assert len(bind_warnings("agents.example.org", long)) == 1


@pytest.mark.parametrize("token", ["", "with space", "ünïcode", "tab\there", "nl\n"])
def test_tokens_that_cannot_travel_in_a_header_are_refused(token):
    with pytest.raises(ValueError, match="printable ASCII"):
        check_token(token)
    with pytest.raises(ValueError, match="printable ASCII"):
        make_app(StepperFactory(), token)
