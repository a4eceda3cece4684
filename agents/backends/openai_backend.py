"""Chat Completions backend: the OpenAI API and any OpenAI-compatible server (vLLM, llama.cpp, ...).

Imported only when a spec names such a backend: it imports the ``openai`` SDK (``pip install 'nego[llm]'``).
The SDK's own retries are off (``max_retries=0``); :func:`~nego.agents.backends.limits.call_with_retries`
retries instead, and every reply is validated here because the SDK accepts malformed JSON silently.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import openai
from nego.market.types import Usage

from .base import ChatRequest, ChatResponse, ToolCall
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

log = logging.getLogger("nego.agents.backends")


class OpenAIBackend:
    """``openai:MODEL`` and ``vllm:MODEL@URL``: one client per event loop, created on first use.

    ``kind`` is "openai" or "vllm" (the kind caps concurrency in the marketplace). vLLM and other
    OpenAI-compatible servers get ``max_tokens``; the OpenAI API gets ``max_completion_tokens``.
    """

    def __init__(
        self,
        model: str,
        *,
        kind: str = "openai",
        base_url: str | None = None,
        api_key: str | None = None,
        supports_tools: bool = True,
        limits: RateLimits | None = None,
        policy: RetryPolicy | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        self.kind = kind
        self.model = model
        self.base_url = base_url
        self.supports_tools = supports_tools
        self.limits = limits or RateLimits()
        self.policy = policy or RetryPolicy()
        self.prices = prices or PriceTable()
        self.missing_usage = 0
        self._api_key = Secret(api_key)
        self._per_loop = PerLoop(self._build)

    def __repr__(self) -> str:
        return f"OpenAIBackend(kind={self.kind!r}, model={self.model!r}, base_url={self.base_url!r})"

    def _build(self) -> tuple[openai.AsyncOpenAI, Limiter]:
        client = openai.AsyncOpenAI(
            api_key=self._api_key.reveal() or "none",  # OpenAI-compatible servers without auth still need a value
            base_url=self.base_url,
            max_retries=0,
            timeout=self.policy.timeout_s,
            http_client=openai.DefaultAioHttpClient(timeout=self.policy.timeout_s),
        )
        return client, Limiter(self.limits)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        client, limiter = self._per_loop.get()
        kwargs = self._kwargs(request)
        estimate = estimate_tokens((m.content for m in request.messages), request.max_tokens)
        start = time.perf_counter()

        async def once() -> ChatResponse:
            await limiter.acquire(estimate)
            try:
                return self._validate(await client.chat.completions.create(**kwargs))
            finally:
                limiter.release()

        reply = await call_with_retries(
            once,
            policy=self.policy,
            classify=_classify,
            what=f"{self.kind}:{self.model}",
            secrets=[self._api_key.reveal()],
        )
        usage = reply.usage
        cost = self.prices.cost(self.model, usage.prompt_tokens, usage.completion_tokens)
        latency = time.perf_counter() - start
        return ChatResponse(
            reply.text, reply.tool_calls, Usage(usage.prompt_tokens, usage.completion_tokens, latency, cost, 1)
        )

    def _kwargs(self, request: ChatRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "temperature": request.temperature,
        }
        kwargs["max_completion_tokens" if self.kind == "openai" else "max_tokens"] = request.max_tokens
        if request.seed is not None:
            kwargs["seed"] = request.seed
        if request.tools:
            kwargs["tools"] = [t.openai() for t in request.tools]
        return kwargs

    def _validate(self, resp: Any) -> ChatResponse:
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise MalformedResponse("the reply has no choices")
        message = getattr(choices[0], "message", None)
        if message is None:
            raise MalformedResponse("the reply's first choice has no message")
        content = getattr(message, "content", None)
        if content is not None and not isinstance(content, str):
            raise MalformedResponse(f"message content must be a string, got {type(content).__name__}")
        calls = []
        for tc in getattr(message, "tool_calls", None) or []:
            function = getattr(tc, "function", None)
            name, args = getattr(function, "name", None), getattr(function, "arguments", None)
            if not isinstance(name, str) or not isinstance(args, str):
                raise MalformedResponse("a tool call lacks a string function name or string arguments")
            calls.append(ToolCall(name, args))
        return ChatResponse(content or "", tuple(calls), self._usage(getattr(resp, "usage", None)))

    def _usage(self, usage: Any) -> Usage:
        prompt, completion = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
        if not isinstance(prompt, int) or not isinstance(completion, int):
            self.missing_usage += 1  # counted and logged: token totals of this backend are then lower bounds
            log.warning("%s:%s: reply without token usage (%d so far)", self.kind, self.model, self.missing_usage)
            return Usage()
        return Usage(prompt, completion)

    async def aclose(self) -> None:
        state = self._per_loop.current()
        self._per_loop.forget()
        if state is not None:
            await state[0].close()


def _classify(error: BaseException) -> Failure | None:
    if isinstance(error, MalformedResponse):
        return Failure(True, f"malformed reply: {error}")
    if isinstance(error, openai.APIStatusError):
        headers = error.response.headers
        retry_after = parse_retry_after(headers.get("retry-after"))
        if retry_after is None and headers.get("retry-after-ms") is not None:
            ms = parse_retry_after(headers.get("retry-after-ms"))
            retry_after = ms / 1000 if ms is not None else None
        return Failure(error.status_code in RETRY_STATUS, f"HTTP {error.status_code}: {error.message}", retry_after)
    if isinstance(error, openai.APITimeoutError):
        return Failure(True, "the request timed out")
    if isinstance(error, openai.APIConnectionError):
        return Failure(True, f"connection failed: {error.message}")
    if isinstance(error, openai.APIResponseValidationError | ValueError):
        return Failure(True, f"unreadable reply: {type(error).__name__}: {error}")
    if isinstance(error, openai.OpenAIError):
        return Failure(False, f"{type(error).__name__}: {error}")
    return None
