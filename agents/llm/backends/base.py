"""The chat-backend contract shared by every language-model negotiator backend.

A backend turns one :class:`ChatRequest` (messages, optional action tools) into one :class:`ChatResponse`
(text, tool calls, usage). It validates what the model server sent back itself and raises
:class:`BackendError` once it has given up; it never returns a half-parsed response. Provider SDKs are
imported only inside the modules that implement a backend, never here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from nego.market.types import Usage

ROLES = ("system", "user", "assistant")

TOOL_OFFER = "make_offer"
TOOL_ACCEPT = "accept"
TOOL_WALK_AWAY = "walk_away"
ACTION_TOOLS = (TOOL_OFFER, TOOL_ACCEPT, TOOL_WALK_AWAY)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat: ``role`` is "system", "user" or "assistant"."""

    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"chat role must be one of {', '.join(ROLES)}; got {self.role!r}")
        if not isinstance(self.content, str):
            raise TypeError(f"chat content must be str, got {type(self.content).__name__}")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A provider-neutral function tool: a name, a description and a JSON-Schema object for its arguments.

    Backends translate it to their wire format (OpenAI ``tools=[{"type": "function", ...}]``, Anthropic
    ``tools=[{"name", "description", "input_schema"}]``, a chat template's ``tools=`` argument).
    ``parameters`` must not be mutated; it is a plain dict so it can be handed to JSON encoders directly.
    """

    name: str
    description: str
    parameters: dict[str, Any] = field(hash=False, compare=True)

    def openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def anthropic(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call as the model produced it: the tool's name and its arguments as raw JSON text (unparsed)."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One completion request.

    ``tools`` is the tuple of action tools offered to the model (empty: no tools; plain-text replies only);
    it is truthy exactly when tools are offered. Build it with :func:`nego.agents.llm.parsing.action_tools`.
    ``seed`` is passed to servers that accept one; ``None`` leaves sampling unseeded.
    """

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 512
    temperature: float | None = None
    """None: the backend's own default (1.0 in process; the server's default over HTTP, which some models require)."""
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "tools", tuple(self.tools))
        if not self.messages:
            raise ValueError("a chat request needs at least one message")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature is not None and not (0.0 <= self.temperature <= 2.0):
            raise ValueError(f"temperature must lie in [0, 2], got {self.temperature}")

    @property
    def system(self) -> str:
        """The concatenated system messages (Anthropic takes them apart from the conversation)."""
        return "\n\n".join(m.content for m in self.messages if m.role == "system")

    @property
    def conversation(self) -> tuple[ChatMessage, ...]:
        """The non-system messages, in order."""
        return tuple(m for m in self.messages if m.role != "system")


@dataclass(frozen=True, slots=True)
class ChatResponse:
    """A validated model reply: its text (may be empty when it only called tools), its tool calls, its cost.
    ``truncated`` says the model stopped because it hit ``max_tokens`` (the parser then says so)."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    truncated: bool = False


class BackendError(RuntimeError):
    """A backend gave up on a request (after its retries). The message never contains an API key."""


@runtime_checkable
class ChatBackend(Protocol):
    """Anything that can answer chat requests. ``kind`` names the backend family (e.g. "openai", "hf") for
    per-kind concurrency caps; ``model`` is the model name as the server knows it."""

    kind: str
    model: str
    supports_tools: bool

    async def complete(self, request: ChatRequest) -> ChatResponse: ...

    async def aclose(self) -> None: ...
