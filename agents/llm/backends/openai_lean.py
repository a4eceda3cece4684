"""Chat Completions backend over plain aiohttp: the OpenAI wire format without the ``openai`` SDK.

The default client of ``openai:`` and ``vllm:`` specs (``--client lean``). It sends the same request body as the
SDK path and keeps everything that path guarantees: the same retry loop, limits, timeouts and messages (an HTTP
error reads ``HTTP 429: Error code: 429 - <the server's message>``, as the SDK words it), the same validation of
the reply, usage and cost. What it drops is the SDK's per-call machinery (httpx request objects, pydantic reply
models), which cost about three times the CPU of the call itself when a thousand negotiations run at once. A reply
body larger than :data:`MAX_REPLY_BYTES` is refused unread. Needs only aiohttp, a dependency of nego itself.
"""

from __future__ import annotations

import json
from typing import Any

from ._common import retry_after_seconds
from .base import ChatResponse, ToolCall
from .limits import RETRY_STATUS, Failure, MalformedResponse
from .openai_wire import OPENAI_URL, ChatCompletionsBackend
from .urls import connection_problem

MAX_REPLY_BYTES = 1 << 20
"""Largest reply body read from a model server (a reply of 512 tokens takes a few kilobytes)."""


class HTTPStatusError(Exception):
    """The server answered with a status outside 2xx; ``message`` is worded as the SDK words it."""

    def __init__(self, status: int, message: str, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


class OversizedReply(Exception):
    """A reply body past :data:`MAX_REPLY_BYTES`; not retried (a server that sends one will send it again)."""


class WireClient:
    """One aiohttp session (one connection pool, sized to the backend's concurrency cap) for one event loop.

    :meth:`create` takes the keyword arguments of the SDK's ``chat.completions.create`` and returns the decoded
    JSON reply, unvalidated. Build it inside the event loop that uses it.
    """

    def __init__(self, base_url: str, api_key: str, concurrency: int, timeout_s: float) -> None:
        import aiohttp

        self.url = base_url.rstrip("/") + "/chat/completions"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        )

    async def create(self, **body: Any) -> Any:
        async with self._session.post(self.url, data=json.dumps(body).encode()) as resp:
            status, headers = resp.status, resp.headers
            if resp.content_length is not None and resp.content_length > MAX_REPLY_BYTES:
                raise OversizedReply(f"the reply body is {resp.content_length} bytes, over {MAX_REPLY_BYTES}")
            raw = await _read_capped(resp)
        if not 200 <= status < 300:
            raise HTTPStatusError(status, _status_message(status, raw), retry_after_seconds(headers))
        return json.loads(raw)

    async def close(self) -> None:
        await self._session.close()


async def _read_capped(resp: Any) -> bytes:
    """The whole body when its length is declared (checked against the cap already); else read up to the cap."""
    if resp.content_length is not None:
        return await resp.read()
    data = bytearray()
    async for chunk in resp.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > MAX_REPLY_BYTES:
            raise OversizedReply(f"the reply body runs past {MAX_REPLY_BYTES} bytes")
    return bytes(data)


def _status_message(status: int, raw: bytes) -> str:
    """``Error code: N``, then `` - message`` when the body is JSON with an error message (the SDK's wording)."""
    text = f"Error code: {status}"
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return text
    error = body.get("error", body) if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return f"{text} - {message}" if isinstance(message, str) and message else text


class LeanOpenAIBackend(ChatCompletionsBackend):
    """``openai:MODEL`` and ``vllm:MODEL@URL`` through a :class:`WireClient` per event loop, created on first use."""

    def _new_client(self) -> WireClient:
        # OpenAI-compatible servers without authentication still get a key, as the SDK path sends one
        key = self._api_key.reveal() or "none"
        return WireClient(self.base_url or OPENAI_URL, key, self.limits.concurrency, self.policy.timeout_s)

    def _endpoint(self, client: WireClient) -> Any:
        return client.create

    def _classify(self, error: BaseException) -> Failure | None:
        return classify_wire_error(error, self.base_url or OPENAI_URL)

    def _validate(self, resp: Any) -> ChatResponse:
        choices = resp.get("choices") if isinstance(resp, dict) else None
        if not isinstance(choices, list) or not choices:
            raise MalformedResponse("the reply has no choices")
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message")
        if not isinstance(message, dict):
            raise MalformedResponse("the reply's first choice has no message")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise MalformedResponse(f"message content must be a string, got {type(content).__name__}")
        tool_calls = message.get("tool_calls") or []
        if not isinstance(tool_calls, list):
            raise MalformedResponse("the message's tool_calls is not a list")
        calls = []
        for tc in tool_calls:
            function = tc.get("function") if isinstance(tc, dict) else None
            function = function if isinstance(function, dict) else {}
            name, args = function.get("name"), function.get("arguments")
            if not isinstance(name, str) or not isinstance(args, str):
                raise MalformedResponse("a tool call lacks a string function name or string arguments")
            calls.append(ToolCall(name, args))
        usage = resp.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        usage = self._usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))
        return ChatResponse(content or "", tuple(calls), usage, choice.get("finish_reason") == "length")


def classify_wire_error(error: BaseException, base_url: str) -> Failure | None:
    """Judge an exception raised by a :class:`WireClient` call or by a reply's validation, as
    :func:`~nego.agents.llm.backends._common.classify_sdk_error` judges the SDK's: rate limits, server errors,
    broken or refused connections and unreadable replies are retried (honouring ``Retry-After``); other HTTP
    errors and an oversized reply are not; anything else is not a backend failure (``None``)."""
    import aiohttp

    if isinstance(error, MalformedResponse):
        return Failure(True, f"malformed reply: {error}")
    if isinstance(error, HTTPStatusError):
        return Failure(error.status in RETRY_STATUS, f"HTTP {error.status}: {error.message}", error.retry_after_s)
    if isinstance(error, OversizedReply):
        return Failure(False, f"refused reply: {error}")
    if isinstance(error, aiohttp.ClientError | OSError):
        problem = connection_problem(error, base_url)
        return Failure(True, problem or f"connection failed: {type(error).__name__}: {error}")
    if isinstance(error, RecursionError):  # a reply body nested too deeply for the JSON decoder
        return Failure(True, "unreadable reply: its JSON is nested too deeply to decode")
    if isinstance(error, ValueError):  # not JSON, or not UTF-8
        return Failure(True, f"unreadable reply: {type(error).__name__}: {error}")
    return None
