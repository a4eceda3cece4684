"""What a command or a config says about model agents (server, prompt template, tools, sampling, prices): overrides
of :class:`~nego.agents.model_specs.LLMSettings`, kept as plain values so a config dataclass can hold them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelOptions:
    """Overrides of the model agents' settings (a command's options); empty means the defaults and the environment."""

    base_url: str | None = None
    template: str | None = None
    tools: bool | None = None
    prices: Path | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    client: str | None = None
    """Who sends ``openai:`` and ``vllm:`` requests: "lean" or "sdk" (None: ``NEGO_OPENAI_CLIENT``, else lean)."""

    def settings(self) -> Any:
        """The :class:`nego.agents.model_specs.LLMSettings` these options describe (environment for the rest)."""
        from nego.agents.llm.backends.limits import PriceTable
        from nego.agents.model_specs import LLMSettings

        overrides: dict[str, Any] = {}
        if self.base_url:
            overrides["base_url"] = self.base_url
        if self.template:
            overrides["template"] = self.template
        if self.tools is not None:
            overrides["tools"] = self.tools
        if self.prices is not None:
            overrides["prices"] = PriceTable.load(self.prices)
        if self.temperature is not None:
            overrides["temperature"] = self.temperature
        if self.max_tokens is not None:
            overrides["max_tokens"] = self.max_tokens
        if self.client is not None:
            overrides["client"] = self.client
        return LLMSettings.from_env(**overrides)
