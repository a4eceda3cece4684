"""The messages a chat model receives when it acts: one layout for playing and for training.

With a conversation template (one with an ``[update]`` section, such as :data:`CHAT_TEMPLATE`) a negotiation is one
growing conversation: the template's system and user messages for this side's first observation, then for each of
its earlier replies an assistant message holding that reply's text, followed by a user message rendered from the
observation it replied to and the next one (the other side's new moves, feedback on an invalid reply, the round).
Any other template renders a fresh system and user message from the current observation every turn.

A template whose layout withholds invalid replies (``invalid_replies = withheld``) writes each reply that was not a
legal move as an empty assistant message: the model reads the feedback on it but never its own mistake, which a small
model otherwise copies into every later attempt (``invalid_replies = last_move`` writes this side's last legal reply
there instead, since a small model may copy an empty message too). Whether a reply was a legal move is read from the
two observations around it, as the update message reads it: a retry of the same round means it was not; otherwise it
was if this side's move of that round joined the public history.

The layout is a pure function of what this side saw and said: the observations it acted on and its replies to them
(:class:`Exchange`). The public history holds only valid moves, and never the text of a reply, so the negotiator
keeps its own exchanges (:class:`~nego.agents.llm.negotiator.LLMNegotiator` gets every reply back) and the messages are
rebuilt from them on every turn. A reply is kept as the exact text the model's tokens decode to, never re-rendered
from the move it made: a rendering of the conversation through the model's chat template then reproduces the tokens
the model generated wherever the template writes the reply verbatim and the tokenizer would encode it that way;
training (``nego.training.chat_rollout``) trains only the tokens that it reproduces, so the tokens a model is
trained on and the prompt it is played with are one token sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nego.market.types import Observation

from .backends.base import ChatMessage
from .prompts import PromptTemplate, RenderCache, was_a_move

CHAT_TEMPLATE = "negotiator-chat-v1"
"""The conversation template chat models are trained on (and so played with, see the model registry)."""


@dataclass(frozen=True, slots=True)
class Exchange:
    """One reply of this side: the observation it answered and the reply's text as the model wrote it."""

    obs: Observation
    reply: str


def chat_messages(
    template: PromptTemplate,
    exchanges: Sequence[Exchange],
    obs: Observation,
    *,
    tools: bool,
    cache: RenderCache | None = None,
) -> tuple[ChatMessage, ...]:
    """The messages for acting on ``obs`` after ``exchanges`` (this side's earlier replies in this negotiation, in
    order). A template without an ``[update]`` section ignores the exchanges and renders ``obs`` afresh."""
    if not template.conversational:
        return template.render(obs, tools=tools, cache=cache)
    cache = cache if cache is not None else RenderCache()
    first = exchanges[0].obs if exchanges else obs
    messages = list(template.render(first, tools=tools, cache=cache))
    last_move = WITHHELD
    for i, exchange in enumerate(exchanges):
        following = exchanges[i + 1].obs if i + 1 < len(exchanges) else obs
        if not template.withhold_invalid or was_a_move(exchange.obs, following):
            text = last_move = exchange.reply
        else:
            text = last_move if template.invalid_replies == "last_move" else WITHHELD
        messages.append(ChatMessage("assistant", text))
        messages.append(template.render_update(exchange.obs, following, tools=tools, cache=cache))
    return tuple(messages)


WITHHELD = ""
"""What a layout that withholds invalid replies writes in place of one."""
