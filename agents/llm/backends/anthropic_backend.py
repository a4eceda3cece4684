"""Messages API backend for Anthropic models (``anthropic:MODEL``), with tool use.

Imported only when a spec names it: it imports the ``anthropic`` SDK (``pip install 'nego[llm]'``). System
messages go in the ``system`` parameter; ``max_tokens`` is required by the API. The installed SDK's
``messages.create`` takes no sampling temperature, so requests use the model's default sampling and
``ChatRequest.temperature`` and ``seed`` are not sent (the API has no seed either). The API refuses an empty message
before the last, which a conversation holds where a model wrote nothing or a layout withholds an invalid reply:
such a message is sent as :data:`EMPTY_TURN`.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
from nego.market.types import Usage

from ._common import SDKBackend, classify_sdk_error, sdk_client
from .base import ChatRequest, ChatResponse, ToolCall
from .limits import Failure, MalformedResponse

EMPTY_TURN = "(no reply)"
"""What an empty message of a conversation is sent as (the Messages API requires text in every earlier one)."""


class AnthropicBackend(SDKBackend):
    """One ``AsyncAnthropic`` client per event loop, created on first use; replies validated here."""

    kind = "anthropic"
    supports_tools = True
    key_env = "ANTHROPIC_API_KEY"

    def _new_client(self) -> anthropic.AsyncAnthropic:
        key = self._api_key.reveal()
        return sdk_client(anthropic, anthropic.AsyncAnthropic, key, self.base_url, self.policy.timeout_s)

    def _endpoint(self, client: anthropic.AsyncAnthropic) -> Any:
        return client.messages.create

    def _classify(self, error: BaseException) -> Failure | None:
        return classify_sdk_error(
            error, anthropic, anthropic.AnthropicError, self.base_url or "https://api.anthropic.com"
        )

    def _kwargs(self, request: ChatRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "messages": [{"role": m.role, "content": m.content or EMPTY_TURN} for m in request.conversation],
        }
        if request.system:
            kwargs["system"] = request.system
        if request.tools:
            kwargs["tools"] = [t.anthropic() for t in request.tools]
        return kwargs

    def _validate(self, resp: Any) -> ChatResponse:
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
                try:
                    arguments = json.dumps(block.input)
                except (RecursionError, ValueError, TypeError):
                    raise MalformedResponse("a tool_use input cannot be encoded as JSON (nested too deeply?)") from None
                calls.append(ToolCall(name, arguments))
            elif not isinstance(kind, str):
                raise MalformedResponse("a content block has no type")
        usage = getattr(resp, "usage", None)
        prompt, completion = getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None)
        if not isinstance(prompt, int) or not isinstance(completion, int):
            raise MalformedResponse("the reply has no token usage")
        truncated = getattr(resp, "stop_reason", None) == "max_tokens"
        return ChatResponse("".join(texts), tuple(calls), Usage(prompt, completion), truncated)
