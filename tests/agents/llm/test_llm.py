"""LLM negotiators end to end: full negotiations through the real SDKs, faults, isolation, prompt templates."""

from __future__ import annotations

import json
import re

import pytest
from nego.agents.llm.backends.anthropic_backend import AnthropicBackend
from nego.agents.llm.backends.limits import RetryPolicy
from nego.agents.llm.backends.openai_backend import OpenAIBackend
from nego.agents.llm.negotiator import LLMNegotiator
from nego.agents.llm.parsing import read_envelope
from nego.agents.llm.prompts import FIELDS, TemplateError, builtin_templates, load_template, parse_template
from nego.market.protocol import ProtocolConfig, run_negotiation
from nego.market.types import ActionKind, EndReason, Observation
from nego.scenarios.scenario import Role

from ...conftest import make_widget_scenario
from ...fakes.llm_server import prompt_brain, serve

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.01, timeout_s=5.0)
PLAN = {
    "seller": [{"price": p, "quantity": 10, "warranty": "1y"} for p in (150, 140, 130, 120, 110, 100)],
    "buyer": [{"price": p, "quantity": 10, "warranty": "2y"} for p in (60, 70, 80, 90, 100, 110)],
}
BRAIN = prompt_brain(PLAN, {"seller": 0.6, "buyer": 0.55})


@pytest.fixture
async def servers():
    async with serve(BRAIN) as seller_srv, serve(BRAIN) as buyer_srv:
        seller_srv.backends = []
        yield seller_srv, buyer_srv
        for backend in seller_srv.backends:
            await backend.aclose()


def pair(servers, seller_tools=True, buyer_tools=False):
    seller_srv, buyer_srv = servers
    sb = OpenAIBackend("seller-model", base_url=seller_srv.openai_url, api_key="k1", policy=FAST)
    bb = AnthropicBackend("buyer-model", base_url=buyer_srv.anthropic_url, api_key="k2", policy=FAST)
    seller_srv.backends += [sb, bb]
    return (
        LLMNegotiator(sb, role=Role.SELLER, seed=1, use_tools=seller_tools),
        LLMNegotiator(bb, role=Role.BUYER, seed=2, use_tools=buyer_tools),
    )


@pytest.mark.parametrize(("seller_tools", "buyer_tools"), [(True, False), (False, True)])
async def test_full_negotiation_reaches_the_scripted_deal(servers, seller_tools, buyer_tools):
    seller, buyer = pair(servers, seller_tools, buyer_tools)
    r = await run_negotiation(make_widget_scenario(), seller, buyer, seed=3)
    assert r.outcome.end_reason is EndReason.AGREEMENT
    assert r.outcome.agreement == PLAN["seller"][5] and r.outcome.rounds == 6
    assert r.outcome.invalid_seller == r.outcome.invalid_buyer == 0
    assert r.usage_seller.calls == 6 and r.usage_buyer.calls == 6 and r.usage_buyer.prompt_tokens > 0
    env = read_envelope(r.turns[0].action.raw)
    assert env["prompt"] == seller.prompt_id and env["prompt"].startswith("negotiator-v2:")
    seeds = [req.body["seed"] for req in servers[0].requests]
    assert len(set(seeds)) == 6  # one sampling seed per round
    # the free-text message travels to the other side with the binding offer it came with
    first_buyer_prompt = servers[1].requests[0].body["messages"][-1]["content"]
    assert "Round 1, seller: offered price=150 USD, quantity=10 units, warranty=1y" in first_buyer_prompt
    assert 'Message: "round 1 offer"' in first_buyer_prompt


async def test_faults_become_retries_invalid_actions_or_error_outcomes(servers):
    seller_srv, buyer_srv = servers
    seller, buyer = pair(servers)
    seller_srv.control.fail(1, 429, "0.01")  # retried inside the backend: invisible to the protocol
    seller_srv.control.corrupt(1, "wrong_types")  # a counted invalid action, with feedback
    r = await run_negotiation(make_widget_scenario(), seller, buyer)
    assert r.outcome.end_reason is EndReason.AGREEMENT and r.outcome.invalid_seller == 1
    bad = next(t for t in r.turns if not t.valid)
    assert bad.action.kind is ActionKind.INVALID and "price must be a number" in bad.feedback
    retry_prompt = seller_srv.requests[2].body["messages"][-1]["content"]
    assert "Your previous reply was not a valid move: price must be a number" in retry_prompt

    buyer_srv.control.fail(FAST.max_attempts, 500)
    r = await run_negotiation(make_widget_scenario(), *pair(servers), config=ProtocolConfig(max_retries=1))
    assert r.outcome.end_reason is EndReason.ERROR and r.outcome.ended_by is Role.BUYER
    assert "BackendError" in r.outcome.error and "HTTP 500" in r.outcome.error


async def test_the_sellers_private_brief_never_reaches_the_buyers_backend(servers):
    canary = "CANARY-SELLER-BRIEF-9931"
    scenario = make_widget_scenario(seller_brief=f"Clear old stock. {canary}")
    await run_negotiation(scenario, *pair(servers))
    seller_srv, buyer_srv = servers
    assert canary in json.dumps(seller_srv.requests[0].body)
    buyer_bodies = json.dumps([r.body for r in buyer_srv.requests])
    assert len(buyer_srv.requests) >= 5 and canary not in buyer_bodies
    assert "weight 0.60" not in buyer_bodies  # nor the seller's weights


def _obs(role=Role.BUYER, **kw) -> Observation:
    view = make_widget_scenario(buyer_brief="Budget is tight.").view_for(role)
    return Observation(view, (), 1, None, **kw)


def test_prompt_shows_own_priorities_feedback_and_the_reply_format():
    system, user = load_template().render(_obs(feedback="price must be a number"), tools=False)
    assert "You are the buyer" in system.content and "Budget is tight." in system.content
    assert "- price: weight 0.50 (most important); lower is better" in system.content
    assert "none=0.00, 1y=0.60, 2y=1.00" in system.content and "worth 0.30 to you" in system.content
    assert '"price": <int 50..150 step 5>' in system.content
    assert "Round 1 of 6" in user.content and "price must be a number" in user.content
    assert "cannot accept now" in user.content
    system, _ = load_template().render(_obs(), tools=True)
    assert "calling exactly one of the tools make_offer, accept, walk_away" in system.content


def _blank_runs_closed(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


@pytest.mark.parametrize("name", builtin_templates())
async def test_cached_rendering_is_the_same_text_as_rendering_afresh(name):
    """With every built-in template (each uses its own set of turn fields, only those are computed)."""
    from nego.agents.llm.prompts import RenderCache, prompt_fields
    from nego.agents.registry import resolve

    seen: dict[Role, list[Observation]] = {Role.SELLER: [], Role.BUYER: []}

    class Recording:
        def __init__(self, inner):
            self.inner = inner

        async def act(self, obs):
            seen[obs.role].append(obs)
            return await self.inner.act(obs)

    scenario = make_widget_scenario(seller_brief="Keep $$ margins.", max_rounds=8)
    seller, buyer = resolve("boulware"), resolve("conceder")
    await run_negotiation(scenario, Recording(seller(Role.SELLER, 1)), Recording(buyer(Role.BUYER, 2)))
    template, cache = load_template(name), RenderCache()
    # one cache across both sides, both tool settings and a rebuilt (equal, not identical) history
    sequence = [(o, t) for o in seen[Role.SELLER] for t in (True, False)] + [(o, False) for o in seen[Role.BUYER]]
    last = seen[Role.BUYER][-1]
    sequence.append((Observation(last.scenario, tuple(reversed(last.history)), last.round, None), False))
    assert len(sequence) > 12 and len(last.history) > 4
    for obs, tools in sequence:
        assert template.render(obs, tools=tools, cache=cache) == template.render(obs, tools=tools)
        every = prompt_fields(obs, tools=tools)  # all fields, none skipped
        expected = [_blank_runs_closed(section.substitute(every)) for section in (template.system, template.user)]
        assert [m.content for m in template.render(obs, tools=tools, cache=cache)] == expected


def test_template_override_from_a_file_and_its_errors(tmp_path):
    path = tmp_path / "terse-v2.txt"
    path.write_text("[system]\nYou sell $product; costs in $$.\n[user]\nRound $round. $feedback\n")
    t = load_template(str(path))
    assert t.id.startswith("terse-v2:") and t.id != load_template().id
    system, user = t.render(_obs(), tools=False)
    assert system.content == "You sell industrial widgets; costs in $.\n" and user.content == "Round 1.\n"
    with pytest.raises(TemplateError, match=r"unknown field\(s\) \$seller_weights"):
        parse_template("x", "[system]\n$seller_weights\n[user]\nhi\n")
    with pytest.raises(TemplateError, match=r"missing section\(s\) \[user\]"):
        parse_template("x", "[system]\nhi\n")
    with pytest.raises(TemplateError, match="neither a built-in template"):
        load_template("no-such-template")
    assert set(FIELDS) >= {"role", "history", "feedback", "priorities"}


def test_negotiator_refuses_the_other_sides_observation_and_unsupported_tools():
    backend = OpenAIBackend("m", kind="vllm", base_url="http://127.0.0.1:9/v1", supports_tools=False)
    neg = LLMNegotiator(backend, role="seller", seed=0)
    assert neg.use_tools is False
    with pytest.raises(ValueError, match="does not support tools"):
        LLMNegotiator(backend, role="seller", seed=0, use_tools=True)
    with pytest.raises(ValueError, match="plays the seller"):
        import asyncio

        asyncio.run(neg.act(_obs(Role.BUYER)))


def test_every_field_is_computed_either_once_per_negotiation_or_per_turn():
    """A field in neither set would never be filled in (rendering computes only the turn fields a template uses)."""
    from nego.agents.llm.prompts import STATIC_FIELDS, TURN_FIELDS

    assert set(FIELDS) - STATIC_FIELDS == TURN_FIELDS and not TURN_FIELDS & STATIC_FIELDS
