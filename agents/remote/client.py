"""Negotiators that live behind an HTTP server (``nego serve-agent``), reached as ``remote:URL``.

A :class:`RemoteNegotiator` sends the server the observation it was given, which holds only its own side's
view, and turns the reply into an :class:`Action`. Connection errors, timeouts and 5xx answers are retried
with exponential backoff; a reply that is not a well-formed action (including one past the parsing limits of
:mod:`nego.scenarios.safeload`: deep nesting, huge integers) counts as an invalid action (the protocol answers
it with feedback, as for unparseable model output); a request the server refuses (4xx), a reply larger than
:data:`MAX_REPLY_BYTES`, or one that still fails after the retries raises :class:`RemoteAgentError`, which
ends the negotiation as an error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from nego.market.protocol import NegotiatorError
from nego.market.types import Action, Observation, Usage
from nego.scenarios.safeload import DataLimitError, loads_json
from nego.scenarios.scenario import Role

from ..secrets import Scrubber
from .wire import WIRE_VERSION, WireError, action_from_dict, observation_to_dict

TOKEN_ENV = "NEGO_AGENT_TOKEN"
MAX_BACKOFF_S = 8.0
MAX_RAW_CHARS = 4000
"""How much of a malformed reply is kept in the transcript (enough to see what went wrong)."""
MAX_REPLY_BYTES = 1 << 20
"""Largest reply read from a server (an action takes a few hundred bytes)."""


NOT_RETRIED = frozenset({501, 505})
"""Server errors that say the request itself will never be served (no such method or route, an HTTP version it does
not speak): asking again only makes the user wait."""


class RemoteAgentError(NegotiatorError):
    """The remote agent could not be reached, or refused the request, after every retry."""


class RemoteFactory:
    """Builds one :class:`RemoteNegotiator` per negotiation, all sharing one HTTP session.

    ``url`` is the server's base URL (``http://host:port``); ``token`` defaults to ``$NEGO_AGENT_TOKEN``;
    ``timeout_s`` bounds one HTTP request; ``retries`` is how many times a failed request is tried again.
    The HTTP session is created on the running event loop at first use; call :meth:`aclose` when done.
    """

    kind = "remote"

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 120.0,
        retries: int = 2,
        backoff_s: float = 0.5,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"remote agent URL must look like http://host:port, got {url!r}")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError("timeout_s must be positive, retries and backoff_s non-negative")
        self.url = url.rstrip("/")
        self.spec = f"remote:{self.url}"
        self.token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._session: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, role: Role, seed: int) -> RemoteNegotiator:
        return RemoteNegotiator(self, Role(role), seed)

    def __repr__(self) -> str:
        return f"RemoteFactory({self.url!r})"  # never the token

    def _client(self) -> Any:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # a session is bound to the loop it was made on; a new loop (a new asyncio.run) needs a new one
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None
        self._loop = None

    async def post(self, body: dict[str, Any]) -> str:
        """POST ``body`` to ``/act`` and return the 200 reply's text, retrying what may pass on retry."""
        import aiohttp

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(MAX_BACKOFF_S, self.backoff_s * 2 ** (attempt - 1)))
            try:
                async with self._client().post(f"{self.url}/act", json=body, headers=headers) as resp:
                    raw = await _read_capped(resp.content, MAX_REPLY_BYTES)
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                continue
            if raw is None:
                raise RemoteAgentError(f"{self.url} sent a reply larger than {MAX_REPLY_BYTES} bytes (HTTP {status})")
            text = raw.decode("utf-8", errors="replace")
            if status == 200:
                return text
            last = f"HTTP {status}: {_reason(text)}"
            if status in NOT_RETRIED or (status < 500 and status not in (408, 429)):
                raise RemoteAgentError(f"{self.url} refused the request ({last})")
        raise RemoteAgentError(f"{self.url} failed after {self.retries + 1} attempts ({last})")


class RemoteNegotiator:
    """One side of one negotiation, played by a remote agent server."""

    def __init__(self, factory: RemoteFactory, role: Role, seed: int) -> None:
        self.factory = factory
        self.role = role
        self.seed = seed
        self.negotiation_id = uuid.uuid4().hex  # only names the server's session; never affects play

    async def act(self, obs: Observation) -> Action:
        if obs.role is not self.role:
            raise ValueError(f"this remote negotiator plays the {self.role}, got an observation for the {obs.role}")
        body = {
            "v": WIRE_VERSION,
            "negotiation_id": self.negotiation_id,
            "seed": self.seed,
            "observation": observation_to_dict(obs),
        }
        start = time.perf_counter()
        scrub = Scrubber.from_env()
        try:
            text = await self.factory.post(body)
        except RemoteAgentError as e:
            raise RemoteAgentError(scrub(str(e))) from None
        return scrub.action(decode_reply(text, time.perf_counter() - start))


async def _read_capped(stream: Any, cap: int) -> bytes | None:
    """The whole body, or None as soon as it runs past ``cap`` bytes."""
    data = bytearray()
    async for chunk in stream.iter_chunked(1 << 16):
        data += chunk
        if len(data) > cap:
            return None
    return bytes(data)


def decode_reply(text: str, latency_s: float = 0.0) -> Action:
    """The action in a server's 200 reply, or an invalid action saying what is wrong with the reply."""
    raw = text[:MAX_RAW_CHARS]
    try:
        body = loads_json(text)
    except DataLimitError as e:  # bad syntax, or deep nesting and huge numbers that the parsers would choke on
        return Action.invalid(raw, f"the remote agent's reply was refused: {e}", Usage(latency_s=latency_s))
    try:
        if not isinstance(body, dict) or "action" not in body:
            raise WireError("reply: expected an object with an 'action' field")
        action = action_from_dict(body["action"])
    except WireError as e:
        return Action.invalid(raw, f"the remote agent's reply is not a valid action: {e}", Usage(latency_s=latency_s))
    return dataclasses.replace(action, usage=dataclasses.replace(action.usage or Usage(), latency_s=latency_s))


def _reason(text: str) -> str:
    try:
        body = loads_json(text)
    except DataLimitError:
        return text[:200]
    return str(body.get("error", text[:200])) if isinstance(body, dict) else text[:200]
