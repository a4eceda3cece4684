"""What the two Chat Completions clients share: the SDK's (:mod:`.openai_backend`) and the lean one
(:mod:`.openai_lean`) send the same request body, read the key from the same variable and count replies without
token usage the same way. Imports no SDK and no HTTP library.
"""

from __future__ import annotations

import logging
from typing import Any

from nego.market.types import Usage

from ._common import SDKBackend
from .base import ChatRequest
from .limits import PriceTable, RateLimits, RetryPolicy

log = logging.getLogger("nego.agents.llm.backends")

OPENAI_URL = "https://api.openai.com/v1"
"""Where an ``openai:`` spec without a base URL sends its requests."""


class ChatCompletionsBackend(SDKBackend):
    """``openai:MODEL`` and ``vllm:MODEL@URL`` whatever client sends the requests.

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

    def _usage(self, prompt: Any, completion: Any) -> Usage:
        """Token usage from a reply's ``prompt_tokens`` and ``completion_tokens`` (empty when either is not an int)."""
        if not isinstance(prompt, int) or not isinstance(completion, int):
            self.missing_usage += 1  # counted and logged, not fatal: some compatible servers send no usage
            log.warning("%s:%s: reply without token usage (%d so far)", self.kind, self.model, self.missing_usage)
            return Usage()
        return Usage(prompt, completion)
