"""Messages API backend for Anthropic models (``anthropic:MODEL``), with tool use.

Imported only when a spec names it: it imports the ``anthropic`` SDK (``pip install 'nego[llm]'``). System
messages go in the ``system`` parameter; ``max_tokens`` is required by the API. The installed SDK's
``messages.create`` takes no sampling temperature, so requests use the model's default sampling and
``ChatRequest.temperature`` and ``seed`` are not sent (the API has no seed either).
"""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
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


class AnthropicBackend:
    """One ``AsyncAnthropic`` client per event loop, created on first use; replies validated here."""

    kind = "anthropic"
    supports_tools = True

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
        self.base_url = base_url
        self.limits = limits or RateLimits()
        self.policy = policy or RetryPolicy()
        self.prices = prices or PriceTable()
        self._api_key = Secret(api_key)
        self._per_loop = PerLoop(self._build)

    def __repr__(self) -> str:
        return f"AnthropicBackend(model={self.model!r}, base_url={self.base_url!r})"

    def _build(self) -> tuple[anthropic.AsyncAnthropic, Limiter]:
        client = anthropic.AsyncAnthropic(
            api_key=self._api_key.reveal(),
            base_url=self.base_url,
            max_retries=0,
            timeout=self.policy.timeout_s,
            http_client=anthropic.DefaultAioHttpClient(timeout=self.policy.timeout_s),
        )
        return client, Limiter(self.limits)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        client, limiter = self._per_loop.get()
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "messages": [{"role": m.role, "content": m.content} for m in request.conversation],
        }
        if request.system:
            kwargs["system"] = request.system
        if request.tools:
            kwargs["tools"] = [t.anthropic() for t in request.tools]
        estimate = estimate_tokens((m.content for m in request.messages), request.max_tokens)
        start = time.perf_counter()

        async def once() -> ChatResponse:
            await limiter.acquire(estimate)
            try:
                return _validate(await client.messages.create(**kwargs))
            finally:
                limiter.release()

        reply = await call_with_retries(
            once,
            policy=self.policy,
            classify=_classify,
            what=f"anthropic:{self.model}",
            secrets=[self._api_key.reveal()],
        )
        u = reply.usage
        cost = self.prices.cost(self.model, u.prompt_tokens, u.completion_tokens)
        latency = time.perf_counter() - start
        return ChatResponse(reply.text, reply.tool_calls, Usage(u.prompt_tokens, u.completion_tokens, latency, cost, 1))

    async def aclose(self) -> None:
        state = self._per_loop.current()
        self._per_loop.forget()
        if state is not None:
            await state[0].close()


def _validate(resp: Any) -> ChatResponse:
    content = getattr(resp, "content", None)
    if not isinstance(content, list):
        raise MalformedResponse("the reply has no content list")
    texts, calls = [], []
    for block in content:
        kind = getattr(block, "type", None)
        if kind == "text":
            text = getattr(block, "text", None)
            if not isinstance(text, str):
                raise MalformedResponse("a text block has no string text")
            texts.append(text)
        elif kind == "tool_use":
            name = getattr(block, "name", None)
            if not isinstance(name, str) or not hasattr(block, "input"):
                raise MalformedResponse("a tool_use block lacks a string name or an input")
            # the input is re-encoded as JSON text; a non-object input is left for the action parser to reject
            calls.append(ToolCall(name, json.dumps(block.input)))
        elif not isinstance(kind, str):
            raise MalformedResponse("a content block has no type")
    usage = getattr(resp, "usage", None)
    prompt, completion = getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        raise MalformedResponse("the reply has no token usage")
    return ChatResponse("".join(texts), tuple(calls), Usage(prompt, completion))


def _classify(error: BaseException) -> Failure | None:
    if isinstance(error, MalformedResponse):
        return Failure(True, f"malformed reply: {error}")
    if isinstance(error, anthropic.APIStatusError):
        retry_after = parse_retry_after(error.response.headers.get("retry-after"))
        return Failure(error.status_code in RETRY_STATUS, f"HTTP {error.status_code}: {error.message}", retry_after)
    if isinstance(error, anthropic.APITimeoutError):
        return Failure(True, "the request timed out")
    if isinstance(error, anthropic.APIConnectionError):
        return Failure(True, f"connection failed: {error.message}")
    if isinstance(error, anthropic.APIResponseValidationError | ValueError):
        return Failure(True, f"unreadable reply: {type(error).__name__}: {error}")
    if isinstance(error, anthropic.AnthropicError):
        return Failure(False, f"{type(error).__name__}: {error}")
    return None
