"""What the remote model backends share: one client (a provider SDK's, or the lean Chat Completions client) and
limiter per event loop, the retry loop, usage, latency and cost, and the judgement of SDK exceptions (both SDKs
use the same exception names).

A subclass says only what differs: how to build its client, which endpoint to call with which arguments, and
how to validate the reply. Imports no SDK itself.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from nego.market.types import Usage

from .base import ChatRequest, ChatResponse
from .limits import (
    RETRY_STATUS,
    Failure,
    Limiter,
    MalformedResponse,
    PerLoop,
    PriceTable,
    RateLimits,
    RetryPolicy,
    Secret,
    call_with_retries,
    estimate_tokens,
    parse_retry_after,
)
from .urls import check_base_url, connection_problem


class SDKBackend:
    """A :class:`~nego.agents.llm.backends.base.ChatBackend` over an async client (a provider SDK's, or nego's own).

    Subclasses set ``kind``, ``supports_tools`` and ``key_env`` and implement :meth:`_new_client`,
    :meth:`_endpoint`, :meth:`_kwargs`, :meth:`_validate` and :meth:`_classify`. The API key is held as a
    :class:`Secret` and redacted from every error. ``base_url`` is checked here, before any call
    (``ValueError``: not http(s), no host, a bad port, or a user name or password in it).
    """

    kind: str
    supports_tools: bool
    key_env: str
    """The environment variable the key usually comes from; names the key in redaction markers."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        limits: RateLimits | None = None,
        policy: RetryPolicy | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        self.model = model
        self.base_url = check_base_url(base_url, f"the {self.kind} base URL", self.key_env)
        self.limits = limits or RateLimits()
        self.policy = policy or RetryPolicy()
        self.prices = prices or PriceTable()
        self._api_key = Secret(api_key)
        self._per_loop = PerLoop(lambda: (self._new_client(), Limiter(self.limits)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, model={self.model!r}, base_url={self.base_url!r})"

    def credentials(self) -> tuple[tuple[str, str], ...]:
        """(name, value) of the key this backend sends, for scrubbing replies; empty without a key."""
        key = self._api_key.reveal()
        return ((self.key_env, key),) if key else ()

    def _new_client(self) -> Any:
        raise NotImplementedError

    def _endpoint(self, client: Any) -> Any:
        """The SDK coroutine function that answers one request (e.g. ``client.messages.create``)."""
        raise NotImplementedError

    def _kwargs(self, request: ChatRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _validate(self, reply: Any) -> ChatResponse:
        """The reply as a :class:`ChatResponse` (usage without latency or cost), or :class:`MalformedResponse`."""
        raise NotImplementedError

    def _classify(self, error: BaseException) -> Failure | None:
        raise NotImplementedError

    async def complete(self, request: ChatRequest) -> ChatResponse:
        client, limiter = self._per_loop.get()
        create, kwargs = self._endpoint(client), self._kwargs(request)
        estimate = estimate_tokens((m.content for m in request.messages), request.max_tokens)
        start = time.perf_counter()

        async def once() -> ChatResponse:
            await limiter.acquire(estimate)
            try:
                return self._validate(await create(**kwargs))
            finally:
                limiter.release()

        reply = await call_with_retries(
            once,
            policy=self.policy,
            classify=self._classify,
            what=f"{self.kind}:{self.model}",
            secrets=[self._api_key.reveal()],
        )
        u = reply.usage
        cost = self.prices.cost(self.model, u.prompt_tokens, u.completion_tokens)
        latency = time.perf_counter() - start  # across retries: what the negotiation waited
        usage = Usage(u.prompt_tokens, u.completion_tokens, latency, cost, 1)
        return ChatResponse(reply.text, reply.tool_calls, usage, reply.truncated)

    async def aclose(self) -> None:
        state = self._per_loop.current()
        self._per_loop.forget()
        if state is not None:
            await state[0].close()


def sdk_client(sdk: ModuleType, client_type: type, api_key: str | None, base_url: str | None, timeout_s: float) -> Any:
    """An SDK async client with the SDK's own retries off (``call_with_retries`` retries) on its aiohttp transport
    (measured twice as fast as the default for many concurrent calls)."""
    return client_type(
        api_key=api_key,
        base_url=base_url,
        max_retries=0,
        timeout=timeout_s,
        http_client=sdk.DefaultAioHttpClient(timeout=timeout_s),
    )


def classify_sdk_error(
    error: BaseException, sdk: ModuleType, root_error: type[BaseException], base_url: str | None = None
) -> Failure | None:
    """Judge an exception raised by ``sdk`` (``openai`` or ``anthropic``) or by a reply's validation.

    Rate limits, server errors, timeouts, broken or refused connections and unreadable replies are retried (a
    ``Retry-After`` or ``retry-after-ms`` header is honoured); other SDK errors are not; anything else is not a
    backend failure (``None``: re-raised unchanged). A connection error is named by its cause (refused, host
    not found) and the address tried (``base_url`` when the error does not say), never as a timeout.
    """
    if isinstance(error, MalformedResponse):
        return Failure(True, f"malformed reply: {error}")
    if isinstance(error, sdk.APIStatusError):
        retry = retry_after_seconds(error.response.headers)
        return Failure(error.status_code in RETRY_STATUS, f"HTTP {error.status_code}: {error.message}", retry)
    if isinstance(error, sdk.APIConnectionError):  # a timeout is a connection error to the SDK
        problem = connection_problem(error, base_url)
        if problem is not None:
            return Failure(True, problem)
        if isinstance(error, sdk.APITimeoutError):
            return Failure(True, "the request timed out")
        return Failure(True, f"connection failed: {error.message}")
    if isinstance(error, RecursionError):  # a reply body nested too deeply for the SDK's JSON decoder
        return Failure(True, "unreadable reply: its JSON is nested too deeply to decode")
    if isinstance(error, sdk.APIResponseValidationError | ValueError):
        return Failure(True, f"unreadable reply: {type(error).__name__}: {error}")
    if isinstance(error, root_error):
        return Failure(False, f"{type(error).__name__}: {error}")
    return None


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds a reply's ``Retry-After`` (or ``retry-after-ms``) header asks to wait; None without one."""
    seconds = parse_retry_after(headers.get("retry-after"))
    if seconds is None:
        ms = parse_retry_after(headers.get("retry-after-ms"))
        seconds = ms / 1000 if ms is not None else None
    return seconds
