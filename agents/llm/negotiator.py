"""A negotiator driven by a chat language model: render the observation, ask the backend, parse the reply."""

from __future__ import annotations

import logging

from nego.market.types import Action, Observation
from nego.scenarios.issues import Issue
from nego.scenarios.scenario import Role

from ..secrets import Scrubber
from .backends.base import BackendError, ChatBackend, ChatRequest, ChatResponse
from .chat_layout import Exchange, chat_messages
from .parsing import action_tools, clean_text, parse_response, raw_envelope
from .prompts import DEFAULT_TEMPLATE, PromptTemplate, RenderCache, load_template

log = logging.getLogger(__name__)

UNREADABLE_HINT = (
    'reply with one short JSON object such as {"action": "offer", "offer": {...}, "message": "..."}, '
    '{"action": "accept"} or {"action": "walk_away"}, or call one of the tools'
)


class LLMNegotiator:
    """Plays one side of one negotiation through a :class:`ChatBackend`.

    Each turn is one request whose messages :func:`~nego.agents.llm.chat_layout.chat_messages` rebuilds from scratch:
    with a plain template from the :class:`Observation` alone (the full public history is re-rendered every time);
    with a conversation template from this side's earlier observations and replies too (``exchanges``: the only
    thing it keeps, so a negotiation played again from its start replays exactly). A conversation is laid out
    exactly as chat models are trained (``nego.training.chat_rollout``), in text replies: tools are off unless
    asked for, and asking for them is refused. A reply that is not a legal action, whatever it holds, comes back as
    ``Action.invalid``
    with the parser's reason; the protocol sends that reason back as feedback. A backend that gives up raises
    :class:`~nego.agents.llm.backends.base.BackendError`, which ends the negotiation with an error outcome.
    ``Action.raw`` holds a JSON envelope with the template id (see :func:`nego.agents.llm.parsing.raw_envelope`).

    Every action and backend error is passed through ``scrubber`` (default: the credentials in the
    environment and the backend's own key), so a key the model or its server writes into a reply never
    reaches a transcript or the other side.
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
        scrubber: Scrubber | None = None,
    ) -> None:
        self.backend = backend
        self.role = Role(role)
        self.seed = seed
        self.template = template if isinstance(template, PromptTemplate) else load_template(template)
        self.max_tokens = max_tokens
        self.temperature = temperature
        if use_tools and not backend.supports_tools:
            raise ValueError(f"backend {backend.kind}:{backend.model} does not support tools; drop use_tools")
        if use_tools and self.template.conversational:
            raise ValueError(
                f"template {self.template.name!r} lays a negotiation out as a conversation of text replies; "
                "play it without tools"
            )
        if use_tools is None:
            use_tools = backend.supports_tools and not self.template.conversational
        self.use_tools = use_tools
        credentials = getattr(backend, "credentials", None)
        self.scrubber = (
            scrubber if scrubber is not None else Scrubber.from_env(extra=credentials() if credentials else ())
        )
        self.unreadable = 0
        """Replies the parser failed on (a bug in it): each became an invalid action and was logged."""
        self._cache = RenderCache()  # the protocol hands the same view every turn: fixed parts rendered once
        self.exchanges: list[Exchange] = []
        """This side's replies so far and the observations they answered (kept with a conversation template)."""

    @property
    def prompt_id(self) -> str:
        """``<template name>:<sha256 prefix>``: which prompt produced this negotiator's actions."""
        return self.template.id

    async def act(self, obs: Observation) -> Action:
        if obs.role is not self.role:
            raise ValueError(f"this negotiator plays the {self.role}, but got an observation for the {obs.role}")
        issues = obs.scenario.issues
        request = ChatRequest(
            messages=chat_messages(self.template, self.exchanges, obs, tools=self.use_tools, cache=self._cache),
            tools=action_tools(issues) if self.use_tools else (),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=self.call_seed(obs),
        )
        try:
            response = await self.backend.complete(request)
        except BackendError as e:
            raise BackendError(self.scrubber(str(e))) from None
        response = self.scrubber.response(response)
        if self.template.conversational:
            self.exchanges.append(Exchange(obs, response.text))
        return self.read(response, issues)

    def read(self, response: ChatResponse, issues: tuple[Issue, ...]) -> Action:
        """The action in ``response``, scrubbed of credentials: a checked move or an invalid one, never an error."""
        response = self.scrubber.response(response)
        try:
            action = parse_response(response, issues, prompt_id=self.prompt_id)
        except Exception as e:  # the parser is total; should it ever fail, the turn is retried, not the run ended
            self.unreadable += 1
            what = f"{type(e).__name__}: {self.scrubber(clean_text(str(e)))[:200]}"
            log.warning("%r: the parser failed on a reply (%s); counted as an invalid action", self, what)
            error = f"your reply could not be read ({type(e).__name__}); {UNREADABLE_HINT}"
            action = Action.invalid(raw_envelope(self.prompt_id, response), error, usage=response.usage)
        return self.scrubber.action(action)

    def call_seed(self, obs: Observation) -> int:
        """A sampling seed per (negotiator seed, round, attempt): a retry samples afresh, a rerun repeats."""
        return (self.seed * 1_000_003 + obs.round * 1_009 + obs.attempt) % 2**31

    def __repr__(self) -> str:
        return f"LLMNegotiator({self.backend.kind}:{self.backend.model}, role={self.role}, prompt={self.prompt_id})"
