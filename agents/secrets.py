"""Keeping credentials out of what a model-backed agent stores or forwards.

A model, or a hostile server behind a base URL, can write a key it was sent back into its reply. Every text
an agent hands on (the action's message, the raw reply, the parser's feedback, a backend's error) passes
through a :class:`Scrubber` first, which replaces the value of each credential nego reads from the
environment with a fixed marker such as ``[redacted:OPENAI_API_KEY]``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nego.market.types import Action

from .llm.backends.base import ChatResponse, ToolCall

SECRET_ENV_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "VLLM_API_KEY", "NEGO_AGENT_TOKEN", "HF_TOKEN")
"""The environment variables nego (or a library it drives) reads credentials from."""
MIN_SECRET_CHARS = 8
"""Shorter values are not scrubbed: replacing a 3-letter "key" everywhere would mangle ordinary text."""


def _marker(name: str) -> str:
    return f"[redacted:{name}]"


@dataclass(frozen=True, slots=True)
class Scrubber:
    """Replaces credential values with ``[redacted:NAME]`` markers. Its repr never shows a value.

    Each value is also looked for as it appears inside a JSON string (escaped), since raw replies are stored
    as JSON. Longer values are replaced first, so a key that contains another is redacted whole.
    """

    secrets: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """(name, value) pairs, longest value first; values shorter than :data:`MIN_SECRET_CHARS` are dropped."""

    def __post_init__(self) -> None:
        pairs = {}
        for name, value in self.secrets:
            if value and len(value) >= MIN_SECRET_CHARS:
                for form in {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}:
                    pairs.setdefault(form, name)
        ordered = sorted(pairs.items(), key=lambda kv: -len(kv[0]))
        object.__setattr__(self, "secrets", tuple((name, value) for value, name in ordered))

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None, extra: Iterable[tuple[str, str | None]] = ()) -> Scrubber:
        """The credentials named in :data:`SECRET_ENV_VARS` that are set, plus ``extra`` (name, value) pairs."""
        env = os.environ if environ is None else environ
        pairs = [(name, env.get(name) or "") for name in SECRET_ENV_VARS]
        return Scrubber(tuple(pairs) + tuple((name, value or "") for name, value in extra))

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def __call__(self, text: str) -> str:
        for name, value in self.secrets:
            if value in text:
                text = text.replace(value, _marker(name))
        return text

    def action(self, action: Action) -> Action:
        """``action`` with its message, raw output and error scrubbed (the same object when nothing changed)."""
        if not self.secrets:
            return action
        message, raw, error = self(action.message), self(action.raw), self(action.error)
        if (message, raw, error) == (action.message, action.raw, action.error):
            return action
        return dataclasses.replace(action, message=message, raw=raw, error=error)

    def response(self, response: ChatResponse) -> ChatResponse:
        """``response`` with its text and tool calls scrubbed, before anything is parsed out of it."""
        if not self.secrets:
            return response
        text = self(response.text)
        calls = tuple(ToolCall(self(c.name), self(c.arguments)) for c in response.tool_calls)
        if text == response.text and calls == response.tool_calls:
            return response
        return dataclasses.replace(response, text=text, tool_calls=calls)
