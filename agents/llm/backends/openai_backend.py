"""Chat Completions backend: the OpenAI API and any OpenAI-compatible server (vLLM, llama.cpp, ...).

Imported only when a spec names such a backend: it imports the ``openai`` SDK (``pip install 'nego[llm]'``).
The SDK's own retries are off; :func:`~nego.agents.llm.backends.limits.call_with_retries` retries instead, and
every reply is validated here because the SDK accepts malformed JSON silently.
"""

from __future__ import annotations

import logging
from typing import Any

import openai
from nego.market.types import Usage

from ._common import SDKBackend, classify_sdk_error, sdk_client
from .base import ChatRequest, ChatResponse, ToolCall
from .limits import Failure, MalformedResponse, PriceTable, RateLimits, RetryPolicy

log = logging.getLogger("nego.agents.llm.backends")


class OpenAIBackend(SDKBackend):
    """``openai:MODEL`` and ``vllm:MODEL@URL``: one client per event loop, created on first use.

    ``kind`` is "openai" or "vllm" (the kind caps concurrency in the marketplace). vLLM and other
    OpenAI-compatible servers get ``max_tokens``; the OpenAI API gets ``max_completion_tokens``.
    ``missing_usage`` counts replies without token usage (the backend's token totals are then lower bounds).
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
        self.key_env = "VLLM_API_KEY" if kind == "vllm" else "OPENAI_API_KEY"
        super().__init__(model, base_url=base_url, api_key=api_key, limits=limits, policy=policy, prices=prices)
        self.supports_tools = supports_tools
        self.missing_usage = 0

    def _new_client(self) -> openai.AsyncOpenAI:
        # OpenAI-compatible servers without authentication still need some key
        key = self._api_key.reveal() or "none"
        return sdk_client(openai, openai.AsyncOpenAI, key, self.base_url, self.policy.timeout_s)

    def _endpoint(self, client: openai.AsyncOpenAI) -> Any:
        return client.chat.completions.create

    def _classify(self, error: BaseException) -> Failure | None:
        return classify_sdk_error(error, openai, openai.OpenAIError, self.base_url or "https://api.openai.com/v1")

    def _kwargs(self, request: ChatRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        }
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
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
        truncated = getattr(choices[0], "finish_reason", None) == "length"
        return ChatResponse(content or "", tuple(calls), self._usage(getattr(resp, "usage", None)), truncated)

    def _usage(self, usage: Any) -> Usage:
        prompt, completion = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
        if not isinstance(prompt, int) or not isinstance(completion, int):
            self.missing_usage += 1  # counted and logged, not fatal: some compatible servers send no usage
            log.warning("%s:%s: reply without token usage (%d so far)", self.kind, self.model, self.missing_usage)
            return Usage()
        return Usage(prompt, completion)
