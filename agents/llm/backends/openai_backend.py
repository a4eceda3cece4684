"""Chat Completions backend over the ``openai`` SDK: the OpenAI API and any OpenAI-compatible server (vLLM, ...).

Imported only when a spec names such a backend and the SDK client is chosen (``--client sdk``): it imports the
``openai`` SDK (``pip install 'nego[llm]'``). The SDK's own retries are off;
:func:`~nego.agents.llm.backends.limits.call_with_retries` retries instead, and every reply is validated here
because the SDK accepts malformed JSON silently.
"""

from __future__ import annotations

from typing import Any

import openai

from ._common import classify_sdk_error, sdk_client
from .base import ChatResponse, ToolCall
from .limits import Failure, MalformedResponse
from .openai_wire import OPENAI_URL, ChatCompletionsBackend


class OpenAIBackend(ChatCompletionsBackend):
    """``openai:MODEL`` and ``vllm:MODEL@URL`` through ``openai.AsyncOpenAI``: one client per event loop, created
    on first use."""

    def _new_client(self) -> openai.AsyncOpenAI:
        # OpenAI-compatible servers without authentication still need some key
        key = self._api_key.reveal() or "none"
        return sdk_client(openai, openai.AsyncOpenAI, key, self.base_url, self.policy.timeout_s)

    def _endpoint(self, client: openai.AsyncOpenAI) -> Any:
        return client.chat.completions.create

    def _classify(self, error: BaseException) -> Failure | None:
        return classify_sdk_error(error, openai, openai.OpenAIError, self.base_url or OPENAI_URL)

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
        usage = getattr(resp, "usage", None)
        usage = self._usage(getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None))
        return ChatResponse(content or "", tuple(calls), usage, truncated)
