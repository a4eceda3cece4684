"""Serve any negotiator over HTTP so that a marketplace elsewhere can bargain with it (``remote:URL``).

``POST /act`` takes ``{"v", "negotiation_id", "seed", "observation"}`` and answers ``{"v", "action"}``;
``GET /health`` answers ``{"ok": true}``, plus ``"v"`` and ``"agent"`` (the served spec) for a caller with the
token. Every ``/act`` call needs ``Authorization: Bearer <token>``. One negotiator instance is kept per
(negotiation, role, seed), so agents that remember the negotiation (tit-for-tat, an LLM's conversation) behave
as they would in process; the oldest sessions are dropped past ``max_sessions``. A retried request (same round,
attempt and history length) gets the answer already given instead of a second call to ``act``, so a lost
response never advances an agent twice.

Everything a client sends is untrusted: bodies are parsed within the limits of :mod:`nego.scenarios.safeload`
and observations within those of scenario files, headers and bodies must arrive within ``read_timeout_s``, and
at most ``max_connections`` connections are held (when full, the oldest one with no request in progress is
closed to make room), so idle or half-sent connections cannot starve ``/health`` and ``/act``. Malformed
requests get a 4xx with the reason and one log line, never a traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import ipaddress
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from nego.market.marketplace import NegotiatorFactory
from nego.market.protocol import Negotiator
from nego.market.types import Action
from nego.scenarios.safeload import DataLimitError, loads_json
from nego.scenarios.scenario import Role, ScenarioView

from .wire import WIRE_VERSION, WireError, action_to_dict, check_version, observation_from_dict

log = logging.getLogger(__name__)

MAX_ID_CHARS = 200
MIN_TOKEN_CHARS = 16
"""Shorter tokens draw a warning when the server is reachable beyond this machine."""


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take to send a request's headers (and to stay idle between requests) and its
    body, and how many connections are held at once (fewer where the process's open-file limit is low)."""

    read_timeout_s: float = 15.0
    max_connections: int = 256


_LIMITS = web.AppKey("nego_connection_limits", ConnectionLimits)


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
    read_timeout_s: float
    sessions: OrderedDict[tuple[str, Role, int], _Session] = field(default_factory=OrderedDict)

    def authorised(self, request: web.Request) -> bool:
        auth = request.headers.get("Authorization", "")
        # a header that is not ASCII cannot hold the (ASCII) token; checked first so that encoding cannot fail
        return auth.isascii() and hmac.compare_digest(auth.encode("ascii"), f"Bearer {self.token}".encode("ascii"))

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
        if not self.authorised(request):
            return web.json_response({"ok": True})  # what is served is for token holders only
        return web.json_response({"ok": True, "v": WIRE_VERSION, "agent": self.factory.spec})

    async def act(self, request: web.Request) -> web.Response:
        if not self.authorised(request):
            return _error(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return _error(413, f"request body of {request.content_length} bytes exceeds {self.max_body_bytes}")
        try:
            raw = await asyncio.wait_for(request.read(), self.read_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body exceeds {self.max_body_bytes} bytes")
        except TimeoutError:
            return _error(408, f"the request body did not arrive within {self.read_timeout_s} s")
        except web.RequestPayloadError as e:
            return _error(400, f"malformed request body: {e}")
        try:
            body = loads_json(raw)
        except DataLimitError as e:
            return _error(400, f"body.{e}" if e.path else f"malformed JSON: {e}")
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


def check_token(token: str) -> None:
    """Raise ValueError unless ``token`` can travel in an HTTP header: non-empty printable ASCII, no spaces."""
    if not token or not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise ValueError("the agent server token must be non-empty printable ASCII without spaces")


def bind_warnings(host: str, token: str, *, generated: bool = False) -> list[str]:
    """What to tell whoever serves on ``host``: nothing on loopback; beyond it, that the traffic is plain HTTP,
    and when the token is short or was not given."""
    if _is_loopback(host):
        return []
    warnings = [
        f"{host or 'every interface'} is reachable beyond this machine over plain HTTP: the token and every "
        "observation travel unencrypted; prefer 127.0.0.1 behind an SSH tunnel or a TLS proxy"
    ]
    if generated:
        warnings.append(
            "no token was given, so a fresh one is generated at every start; clients need the one printed below "
            "(set NEGO_AGENT_TOKEN to a long random secret to keep one)"
        )
    elif len(token) < MIN_TOKEN_CHARS:
        warnings.append(
            f"the token has {len(token)} characters; use at least {MIN_TOKEN_CHARS} random ones on a network"
        )
    return warnings


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name or "" (every interface): treated as reachable from elsewhere
        return False


def make_app(
    factory: NegotiatorFactory,
    token: str,
    *,
    max_body_bytes: int = 1 << 20,
    timeout_s: float = 120.0,
    max_sessions: int = 4096,
    read_timeout_s: float = ConnectionLimits.read_timeout_s,
    max_connections: int = ConnectionLimits.max_connections,
) -> web.Application:
    """An aiohttp application serving negotiators built by ``factory`` behind a bearer ``token``.

    ``max_body_bytes`` bounds a request (413 past it), ``timeout_s`` one call of ``act`` (504 past it),
    ``max_sessions`` the negotiations remembered at once (least recently used dropped first),
    ``read_timeout_s`` the time to send headers (the connection is closed) or a body (408), and
    ``max_connections`` the connections :func:`start` holds at once.
    """
    check_token(token)
    if min(max_body_bytes, timeout_s, max_sessions, read_timeout_s, max_connections) <= 0:
        raise ValueError("max_body_bytes, timeout_s, max_sessions, read_timeout_s and max_connections must be positive")
    service = _AgentService(factory, token, max_body_bytes, timeout_s, max_sessions, read_timeout_s)
    app = web.Application(client_max_size=max_body_bytes)
    app[_LIMITS] = ConnectionLimits(read_timeout_s, max_connections)
    app.router.add_get("/health", service.health)
    app.router.add_post("/act", service.act)

    async def close_factory(_: web.Application) -> None:
        aclose = getattr(factory, "aclose", None)
        if aclose is not None:
            await aclose()

    app.on_cleanup.append(close_factory)
    return app


@dataclass
class RunningServer:
    """A started server: ``await cleanup()`` stops listening, closes every connection and cleans up the app."""

    runner: web.AppRunner
    listener: asyncio.Server

    async def cleanup(self) -> None:
        self.listener.close()
        await self.runner.cleanup()
        await self.listener.wait_closed()


async def start(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[RunningServer, str]:
    """Start serving ``app`` within its :class:`ConnectionLimits` (defaults for an app not made by
    :func:`make_app`); return the server (``await server.cleanup()`` stops it) and the bound base URL."""
    limits = app.get(_LIMITS, ConnectionLimits())
    busy: set[object] = set()
    app.middlewares.append(_mark_busy(busy))
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=limits.read_timeout_s,  # also bounds the wait for a request's headers
        lingering_time=limits.read_timeout_s,
        logger=_ClientErrorLog(logging.getLogger("aiohttp.server"), {}),
    )
    await runner.setup()
    held, backlog = _descriptor_budget(limits.max_connections)
    guard = _ConnectionGuard(runner.server, held, busy)
    listener = await asyncio.get_running_loop().create_server(guard, host, port, backlog=backlog)
    bound_host, bound_port = listener.sockets[0].getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return RunningServer(runner, listener), f"http://{shown}:{bound_port}"


def _mark_busy(busy: set[object]) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def mark(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        busy.add(request.protocol)
        try:
            return await handler(request)
        finally:
            busy.discard(request.protocol)

    return mark


class _ConnectionGuard:
    """The protocol factory in front of aiohttp's: holds at most ``limit`` connections. A new connection past it
    closes the oldest connection with no request in progress (an idle keep-alive, a half-sent header); when
    every connection is busy, the newcomer gets a 503 and is closed."""

    def __init__(self, server: Any, limit: int, busy: set[object]) -> None:
        self.server = server
        self.limit = limit
        self.busy = busy

    def __call__(self) -> asyncio.BaseProtocol:
        live = [h for h in self.server.connections if h.transport is not None and not h.transport.is_closing()]
        if len(live) >= self.limit:
            idle = next((h for h in live if h not in self.busy), None)
            if idle is None:
                log.warning("all %d connections are busy: refused a new one with 503", self.limit)
                return _Refused()
            idle.force_close()
        return self.server()


class _Refused(asyncio.Protocol):
    """Answers 503 and hangs up, whatever the client sends."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        body = b'{"v": %d, "error": "the agent server is at its connection limit"}' % WIRE_VERSION
        head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
        cast(asyncio.Transport, transport).write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        transport.close()


def _descriptor_budget(max_connections: int) -> tuple[int, int]:
    """(connections held, accept backlog) that fit the open-file limit: asyncio accepts up to ``backlog``
    connections at once, and an evicted connection's descriptor is released a moment later, so the budget leaves
    room for two batches beside the held connections, and half of what remains for the agent itself."""
    try:
        import resource
    except ImportError:  # not on every platform
        return max_connections, 100
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections, 100
    backlog = max(8, min(100, soft // 8))
    return min(max_connections, max(1, (soft - 2 * backlog) // 2)), backlog


class _ClientErrorLog(logging.LoggerAdapter):
    """aiohttp logs a traceback for every request it cannot parse (a 10 kB header, broken HTTP); that is the
    client's fault, so it becomes one warning line. Failures of the server itself keep their traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.logger.warning("refused a malformed request (%s): %s", exc_info.code, exc_info.message)
        else:
            self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)
