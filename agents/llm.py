"""A negotiator driven by a chat language model: render the observation, ask the backend, parse the reply."""

from __future__ import annotations

from nego.market.types import Action, Observation
from nego.scenarios.scenario import Role

from .backends.base import ChatBackend, ChatRequest
from .parsing import action_tools, parse_response
from .prompts import DEFAULT_TEMPLATE, PromptTemplate, RenderCache, load_template


class LLMNegotiator:
    """Plays one side of one negotiation through a :class:`ChatBackend`.

    Each turn is one stateless request built from the :class:`Observation` alone (the full public history is
    re-rendered every time), so the negotiator holds no hidden conversation state and a resumed negotiation
    replays exactly. A reply that is not a legal action comes back as ``Action.invalid`` with the parser's
    reason; the protocol sends that reason back as feedback. A backend that gives up raises
    :class:`~nego.agents.backends.base.BackendError`, which ends the negotiation with an error outcome.
    ``Action.raw`` holds a JSON envelope with the template id (see :func:`nego.agents.parsing.raw_envelope`).
    """

    def __init__(
        self,
        backend: ChatBackend,
        *,
        role: Role | str,
        seed: int,
        template: PromptTemplate | str = DEFAULT_TEMPLATE,
        max_tokens: int = 512,
        temperature: float | None = None,
        use_tools: bool | None = None,
    ) -> None:
        self.backend = backend
        self.role = Role(role)
        self.seed = seed
        self.template = template if isinstance(template, PromptTemplate) else load_template(template)
        self.max_tokens = max_tokens
        self.temperature = temperature
        if use_tools and not backend.supports_tools:
            raise ValueError(f"backend {backend.kind}:{backend.model} does not support tools; drop use_tools")
        self.use_tools = backend.supports_tools if use_tools is None else use_tools
        self._cache = RenderCache()  # the protocol hands the same view every turn: fixed parts rendered once

    @property
    def prompt_id(self) -> str:
        """``<template name>:<sha256 prefix>``: which prompt produced this negotiator's actions."""
        return self.template.id

    async def act(self, obs: Observation) -> Action:
        if obs.role is not self.role:
            raise ValueError(f"this negotiator plays the {self.role}, but got an observation for the {obs.role}")
        issues = obs.scenario.issues
        request = ChatRequest(
            messages=self.template.render(obs, tools=self.use_tools, cache=self._cache),
            tools=action_tools(issues) if self.use_tools else (),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=self.call_seed(obs),
        )
        response = await self.backend.complete(request)
        return parse_response(response, issues, prompt_id=self.prompt_id)

    def call_seed(self, obs: Observation) -> int:
        """A sampling seed per (negotiator seed, round, attempt): a retry samples afresh, a rerun repeats."""
        return (self.seed * 1_000_003 + obs.round * 1_009 + obs.attempt) % 2**31

    def __repr__(self) -> str:
        return f"LLMNegotiator({self.backend.kind}:{self.backend.model}, role={self.role}, prompt={self.prompt_id})"
