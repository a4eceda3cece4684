"""The conversation layout chat models are trained and played with: a pure function of the observations one side
acted on and its replies, whose every turn extends the one before."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents.llm.backends.base import ChatRequest, ChatResponse
from nego.agents.llm.backends.openai_backend import OpenAIBackend
from nego.agents.llm.chat_layout import CHAT_TEMPLATE, WITHHELD, Exchange, chat_messages
from nego.agents.llm.negotiator import LLMNegotiator
from nego.agents.llm.prompts import DEFAULT_TEMPLATE, TemplateError, describe_offer, load_template, parse_template
from nego.agents.registry import resolve
from nego.market.protocol import ProtocolConfig, run_negotiation
from nego.market.types import Observation
from nego.scenarios.generator import generate_scenario
from nego.scenarios.scenario import Role

from ...conftest import make_widget_scenario

CHAT = load_template(CHAT_TEMPLATE)
CHAT_TEXT = (resources.files("nego.agents.llm") / "prompts" / f"{CHAT_TEMPLATE}.txt").read_text().rstrip("\n")
WITHHOLDING = parse_template("chat-withheld", CHAT_TEXT + "\n[layout]\ninvalid_replies = withheld\n")
LAST_MOVE = parse_template("chat-last-move", CHAT_TEXT + "\n[layout]\ninvalid_replies = last_move\n")


def expected_replies(template, exchanges, valid) -> list[str]:
    """What the conversation writes for each earlier reply under ``template``'s layout."""
    out, last = [], WITHHELD
    for e, ok in zip(exchanges, valid, strict=False):
        if ok or template.invalid_replies == "shown":
            out.append(e.reply)
            last = e.reply
        else:
            out.append(last if template.invalid_replies == "last_move" else WITHHELD)
    return out


@dataclass
class ScriptedBackend:
    """A text backend that answers with the next scripted reply (the last one once they run out) and keeps every
    request."""

    replies: list[str]
    requests: list[ChatRequest] = field(default_factory=list)
    kind: str = "scripted"
    model: str = "scripted"
    supports_tools: bool = False

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        return ChatResponse(self.replies[min(len(self.requests), len(self.replies)) - 1])

    async def aclose(self) -> None:
        pass


def offer_reply(price: int, warranty: str = "none", message: str = "") -> str:
    offer = {"price": price, "quantity": 10, "warranty": warranty}
    return "```json\n" + json.dumps({"action": "offer", "offer": offer, "message": message}) + "\n```"


def play(replies: list[str], buyer: str = "tft", template=CHAT, max_rounds: int = 4, retries: int = 1):
    backend = ScriptedBackend(replies)
    seller = LLMNegotiator(backend, role=Role.SELLER, seed=5, template=template)
    scenario = make_widget_scenario(max_rounds=max_rounds)
    result = asyncio.run(
        run_negotiation(scenario, seller, resolve(buyer)(Role.BUYER, 1), config=ProtocolConfig(max_retries=retries))
    )
    return seller, backend, result


def test_the_chat_template_opens_like_v2_and_adds_an_update_section():
    v2 = load_template(DEFAULT_TEMPLATE)
    assert CHAT.conversational and not v2.conversational
    assert CHAT.system.template == v2.system.template
    assert CHAT.user.template.replace("${trend}", "") == v2.user.template  # plus how the other side has moved
    assert {"news", "trend"} <= set(CHAT.update.get_identifiers())
    with pytest.raises(TemplateError, match=r"\[user\]: unknown field\(s\) \$news"):
        parse_template("x", "[system]\nhi\n[user]\n$news\n")
    with pytest.raises(TemplateError, match=r"\[update\]: unknown field\(s\) \$nonsense"):
        parse_template("x", "[system]\nhi\n[user]\nmove\n[update]\n$nonsense\n")
    with pytest.raises(TemplateError, match="unexpected section"):
        parse_template("x", "[system]\nhi\n[user]\nmove\n[update]\na\n[update]\nb\n")
    with pytest.raises(TemplateError, match="no \\[update\\] section"):
        obs = Observation(make_widget_scenario().view_for(Role.SELLER), (), 1, None)
        v2.render_update(obs, obs, tools=False)


def test_every_turn_extends_the_last_with_the_reply_and_what_happened_since():
    replies = [offer_reply(150, message="Best quality."), "I am not sure.", offer_reply(140), offer_reply(135)]
    seller, backend, result = play(replies)
    sent = [r.messages for r in backend.requests]
    assert [len(m) for m in sent] == [2 + 2 * k for k in range(len(sent))]
    for k in range(1, len(sent)):
        assert sent[k][: len(sent[k - 1])] == sent[k - 1]  # a turn repeats the conversation so far, then adds to it
        assert sent[k][-2].role == "assistant" and sent[k][-2].content == seller.exchanges[k - 1].reply
    first_update = sent[1][-1].content  # after the seller's opening offer the buyer answered
    buyer_offer = next(t.action.offer for t in result.turns if t.role is Role.BUYER)
    assert describe_offer(buyer_offer, make_widget_scenario()) in first_update
    assert first_update.startswith("- Round 1, buyer: offered") and "Round 2 of 4" in first_update
    retry = sent[2][-1].content  # the reply "I am not sure." held no action: feedback, same round
    assert "Your previous reply was not a valid move" in retry and "Round 2 of 4" in retry
    assert "- Round" not in retry  # nothing happened in between
    # the conversation is rebuilt from the exchanges alone: the same messages, whoever builds them
    assert chat_messages(CHAT, seller.exchanges[:2], seller.exchanges[2].obs, tools=False) == sent[2]


def test_a_turn_lost_to_invalid_replies_is_said_in_the_next_update():
    _, backend, result = play(["no idea", "still no idea", offer_reply(145)], retries=1)
    assert result.outcome.forfeits_seller == 1
    after_forfeit = backend.requests[2].messages[-1].content
    assert after_forfeit.startswith("Your last reply was not a valid move, so your turn passed.")
    assert "Round 2 of 4" in after_forfeit and "Your previous reply was not a valid move" not in after_forfeit


def test_a_turn_the_other_side_lost_is_said_too():
    seller = LLMNegotiator(
        ScriptedBackend([offer_reply(150), offer_reply(145)]), role=Role.SELLER, seed=1, template=CHAT
    )
    mute = LLMNegotiator(ScriptedBackend(["I would rather not say."]), role=Role.BUYER, seed=2)
    config = ProtocolConfig(max_retries=0)
    asyncio.run(run_negotiation(make_widget_scenario(max_rounds=2), seller, mute, config=config))
    update = chat_messages(CHAT, seller.exchanges[:1], seller.exchanges[1].obs, tools=False)[-1].content
    assert update.startswith("The buyer made no valid move, so its turn passed.\nRound 2 of 2")


def test_a_plain_template_renders_each_turn_afresh_and_keeps_no_exchanges():
    seller, backend, _ = play([offer_reply(150), offer_reply(140)], template=load_template(DEFAULT_TEMPLATE))
    assert all(len(r.messages) == 2 for r in backend.requests) and seller.exchanges == []


def test_conversation_templates_answer_in_text():
    backend = OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    assert LLMNegotiator(backend, role="seller", seed=0).use_tools  # plain template: tools where supported
    assert not LLMNegotiator(backend, role="seller", seed=0, template=CHAT_TEMPLATE).use_tools
    with pytest.raises(ValueError, match="conversation of text replies"):
        LLMNegotiator(backend, role="seller", seed=0, template=CHAT_TEMPLATE, use_tools=True)


REPLIES = st.sampled_from(
    [offer_reply(150), offer_reply(120, "1y", "Meet me halfway."), "no action here", '{"action": "accept"}', "{{{"]
)


@settings(max_examples=25, deadline=None)
@given(
    replies=st.lists(REPLIES, min_size=1, max_size=12),
    seed=st.integers(0, 500),
    opener=st.sampled_from(Role),
    buyer=st.sampled_from(["tft", "boulware", "hardliner", "walker"]),
    template=st.sampled_from([CHAT, WITHHOLDING, LAST_MOVE]),
)
def test_the_layout_is_a_pure_function_of_the_exchanges(replies, seed, opener, buyer, template):
    scenario = generate_scenario(seed, index=seed % 7).with_opener(opener)
    backend = ScriptedBackend(replies)
    seller = LLMNegotiator(backend, role=Role.SELLER, seed=seed, template=template)
    result = asyncio.run(run_negotiation(scenario, seller, resolve(buyer)(Role.BUYER, seed)))
    exchanges = seller.exchanges
    assert len(exchanges) == len(backend.requests)
    valid = [t.valid for t in result.turns if t.role is Role.SELLER]
    assert len(valid) == len(exchanges)
    for k, request in enumerate(backend.requests):
        rebuilt = chat_messages(template, exchanges[:k], exchanges[k].obs, tools=False)
        assert rebuilt == request.messages
        assert [m.role for m in rebuilt] == ["system", "user"] + ["assistant", "user"] * k
        if k:
            assert rebuilt[: 2 * k] == backend.requests[k - 1].messages
        # each earlier reply verbatim, or withheld exactly when it was not a legal move
        written = [m.content for m in rebuilt if m.role == "assistant"]
        assert written == expected_replies(template, exchanges[:k], valid)
    assert all(isinstance(e, Exchange) and e.obs.role is Role.SELLER for e in exchanges)


def test_a_layout_section_is_read_and_checked():
    assert WITHHOLDING.withhold_invalid and not CHAT.withhold_invalid
    assert WITHHOLDING.id != CHAT.id and WITHHOLDING.update.template == CHAT.update.template
    small = load_template("negotiator-chat-small-v3")
    assert small.withhold_invalid and small.system.template == load_template("negotiator-chat-small-v1").system.template
    base = "[system]\nhi\n[user]\nmove\n[update]\nnews\n[layout]\n"
    assert parse_template("x", base + "invalid_replies = shown\n\n").withhold_invalid is False
    assert LAST_MOVE.withhold_invalid and load_template("negotiator-chat-small-v4").invalid_replies == "last_move"
    for bad in ("invalid_replies = hidden", "replies = withheld", "invalid_replies"):
        with pytest.raises(TemplateError, match=r"\[layout\]: cannot read .*shown \| withheld \| last_move"):
            parse_template("x", base + bad + "\n")
    with pytest.raises(TemplateError, match="only a conversation template"):
        parse_template("x", "[system]\nhi\n[user]\nmove\n[layout]\ninvalid_replies = withheld\n")


def test_a_withheld_reply_is_an_empty_message_and_its_feedback_stays():
    replies = [offer_reply(150), offer_reply(999_999), offer_reply(140), "no idea", "still no idea", offer_reply(135)]
    _, backend, result = play(replies, template=WITHHOLDING, max_rounds=5)
    assert result.outcome.invalid_seller >= 3 and result.outcome.forfeits_seller == 1
    last = backend.requests[-1].messages
    assert [m.content for m in last if m.role == "assistant"] == [
        replies[0],
        WITHHELD,  # the price out of range
        replies[2],  # its retry, valid
        WITHHELD,
        WITHHELD,  # the turn lost to two unreadable replies
        replies[5],
    ]
    retry = backend.requests[2].messages[-1].content
    assert "Your previous reply was not a valid move" in retry and "price" in retry  # what was wrong is still said
    assert "Your last reply was not a valid move, so your turn passed." in backend.requests[5].messages[-1].content


def test_last_move_writes_the_last_legal_reply_in_place_of_an_invalid_one():
    replies = ["no idea", offer_reply(150), offer_reply(999_999), offer_reply(140), "still no idea", offer_reply(135)]
    _, backend, result = play(replies, template=LAST_MOVE, max_rounds=5)
    assert result.outcome.invalid_seller >= 3
    last = backend.requests[-1].messages
    assert [m.content for m in last if m.role == "assistant"][:5] == [
        WITHHELD,  # invalid before any legal reply: nothing to show yet
        replies[1],
        replies[1],  # the price out of range, written as the last legal reply
        replies[3],
        replies[3],
    ]
