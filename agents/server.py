"""Serve any negotiator over HTTP so that a marketplace elsewhere can bargain with it (``remote:URL``).

``POST /act`` takes ``{"v", "negotiation_id", "seed", "observation"}`` and answers ``{"v", "action"}``;
``GET /health`` answers ``{"ok": true, "v", "agent"}``. Every ``/act`` call needs ``Authorization: Bearer
<token>``. One negotiator instance is kept per (negotiation, role, seed), so agents that remember the
negotiation (tit-for-tat, an LLM's conversation) behave as they would in process; the oldest sessions are
dropped past ``max_sessions``. A retried request (same round, attempt and history length) gets the answer
already given instead of a second call to ``act``, so a lost response never advances an agent twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from nego.market.protocol import Negotiator
from nego.market.types import Action
from nego.scenarios.scenario import Role, ScenarioView

from .wire import WIRE_VERSION, WireError, action_to_dict, check_version, observation_from_dict

log = logging.getLogger(__name__)

MAX_ID_CHARS = 200


class NegotiatorFactory(Protocol):
    """What the server needs from an agent spec: a name and a way to build one negotiator per negotiation."""

    spec: str

    def __call__(self, role: Role, seed: int) -> Negotiator: ...


@dataclass
class _Session:
    negotiator: Negotiator
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    answered: tuple[tuple[int, int, int], dict[str, Any]] | None = None
    view: ScenarioView | None = None


@dataclass
class _AgentService:
    factory: NegotiatorFactory
    token: str
    max_body_bytes: int
    timeout_s: float
    max_sessions: int
    sessions: OrderedDict[tuple[str, Role, int], _Session] = field(default_factory=OrderedDict)

    def session(self, key: tuple[str, Role, int]) -> _Session:
        found = self.sessions.get(key)
        if found is None:
            found = _Session(self.factory(key[1], key[2]))
            self.sessions[key] = found
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        self.sessions.move_to_end(key)
        return found

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "v": WIRE_VERSION, "agent": self.factory.spec})

    async def act(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if not hmac.compare_digest(auth.encode(), f"Bearer {self.token}".encode()):
            return _error(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return _error(413, f"request body of {request.content_length} bytes exceeds {self.max_body_bytes}")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body exceeds {self.max_body_bytes} bytes")
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return _error(400, f"malformed JSON: {e}")
        try:
            nid, seed, obs = _parse_act(body)
        except WireError as e:
            return _error(400, str(e))
        session = self.session((nid, obs.role, seed))
        key = (obs.round, obs.attempt, len(obs.history))
        async with session.lock:
            if session.answered is not None and session.answered[0] == key:
                return web.json_response(session.answered[1])
            if session.view is not None and session.view == obs.scenario:
                # in process an agent gets the very same view object every turn, and some key caches on it
                obs = dataclasses.replace(obs, scenario=session.view)
            session.view = obs.scenario
            try:
                action = await asyncio.wait_for(session.negotiator.act(obs), self.timeout_s)
            except TimeoutError:
                return _error(504, f"the agent did not act within {self.timeout_s} s")
            except Exception as e:  # the client retries or ends its negotiation; the server keeps serving
                log.exception("agent %s failed in negotiation %s", self.factory.spec, nid)
                return _error(500, f"the agent failed: {type(e).__name__}: {e}")
            if not isinstance(action, Action):
                return _error(500, f"the agent returned {type(action).__name__}, not an Action")
            reply = {"v": WIRE_VERSION, "action": action_to_dict(action)}
            session.answered = (key, reply)
        return web.json_response(reply)


def _parse_act(body: object) -> tuple[str, int, Any]:
    if not isinstance(body, dict):
        raise WireError(f"body: expected an object, got {type(body).__name__}")
    extra = sorted(set(body) - {"v", "negotiation_id", "seed", "observation"})
    if extra:
        raise WireError(f"body: unknown field(s) {', '.join(map(repr, extra))}")
    check_version(body, "body")
    nid = body.get("negotiation_id")
    if not isinstance(nid, str) or not 0 < len(nid) <= MAX_ID_CHARS:
        raise WireError(f"body.negotiation_id: expected a non-empty string of at most {MAX_ID_CHARS} characters")
    seed = body.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise WireError(f"body.seed: expected an integer, got {seed!r}")
    if "observation" not in body:
        raise WireError("body.observation: missing")
    return nid, seed, observation_from_dict(body["observation"])


def _error(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"v": WIRE_VERSION, "error": reason}, status=status, headers=headers)


def make_app(
    factory: NegotiatorFactory,
    token: str,
    *,
    max_body_bytes: int = 1 << 20,
    timeout_s: float = 120.0,
    max_sessions: int = 4096,
) -> web.Application:
    """An aiohttp application serving negotiators built by ``factory`` behind a bearer ``token``.

    ``max_body_bytes`` bounds a request (413 past it), ``timeout_s`` one call of ``act`` (504 past it),
    ``max_sessions`` the negotiations remembered at once (least recently used dropped first).
    """
    if not token:
        raise ValueError("the agent server needs a non-empty token")
    if max_body_bytes < 1 or timeout_s <= 0 or max_sessions < 1:
        raise ValueError("max_body_bytes, timeout_s and max_sessions must be positive")
    service = _AgentService(factory, token, max_body_bytes, timeout_s, max_sessions)
    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_get("/health", service.health)
    app.router.add_post("/act", service.act)

    async def close_factory(_: web.Application) -> None:
        aclose = getattr(factory, "aclose", None)
        if aclose is not None:
            await aclose()

    app.on_cleanup.append(close_factory)
    return app


async def start(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Start serving ``app``; return the runner (``await runner.cleanup()`` stops it) and the bound base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound_host, bound_port = runner.addresses[0][:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return runner, f"http://{shown}:{bound_port}"
