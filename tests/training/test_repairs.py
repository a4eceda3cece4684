"""Repair examples of the chat warm start: every inserted reply is a real mistake, the feedback is the protocol's own,
the negotiation played again through the protocol with those replies is the repaired one, and only the valid replies
are trained."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents.llm.backends.base import ChatResponse
from nego.agents.llm.parsing import action_to_json, parse_response
from nego.agents.llm.prompts import load_template
from nego.agents.registry import resolve
from nego.market.marketplace import run_jobs
from nego.market.protocol import judge
from nego.market.types import ActionKind
from nego.scenarios.generator import generate_scenarios
from nego.scenarios.scenario import Role
from nego.training.episode_lengths import reply_text
from nego.training.repairs import corrupt_offer, with_repairs

from .test_chat_warm_start import SMALL, ReplayBackend, ReplayFactory, _played, real_tokenizer

SCENARIOS = generate_scenarios(24, 11)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(SCENARIOS) - 1), st.integers(0, 2**32 - 1))
def test_every_corrupted_offer_is_judged_invalid_by_the_parser_and_the_protocol(index, seed):
    scenario = SCENARIOS[index]
    rng = np.random.default_rng(seed)
    values = {i.name: i.grid()[int(rng.integers(i.size))] for i in scenario.issues}
    body = {"action": "offer", "offer": values}
    wrong = corrupt_offer(body, scenario.issues, rng)
    assert wrong is not None and wrong["offer"] != values and set(wrong) == set(body)
    action = parse_response(ChatResponse(json.dumps(wrong)), scenario.issues)
    feedback, _ = judge(scenario, action, None, None, Role.SELLER)
    assert feedback


@pytest.mark.parametrize("seed", range(3))
def test_repairs_insert_one_invalid_attempt_before_offers_and_keep_every_valid_move(seed):
    for p in _played(4, seed):
        same = with_repairs(p.job.scenario, p.result, 0.0, np.random.default_rng(seed))
        assert same.turns == p.result.turns
        repaired = with_repairs(p.job.scenario, p.result, 1.0, np.random.default_rng(seed))
        assert [t.index for t in repaired.turns] == list(range(len(repaired.turns)))
        valid = [t for t in repaired.turns if t.valid]
        assert [(t.round, t.role, t.action) for t in valid] == [(t.round, t.role, t.action) for t in p.result.turns]
        offers = [t for t in p.result.turns if t.role is Role.SELLER and t.action.kind is ActionKind.OFFER]
        invalid = [t for t in repaired.turns if not t.valid]
        assert len(invalid) == len(offers) > 0
        for i, t in enumerate(repaired.turns):
            if not t.valid:
                after = repaired.turns[i + 1]
                assert t.role is Role.SELLER and t.attempt == 0 and t.feedback
                assert after.valid and (after.round, after.role, after.attempt) == (t.round, Role.SELLER, 1)
        assert repaired.outcome == p.result.outcome


def test_a_repair_rate_outside_zero_to_one_is_refused():
    p = _played(1)[0]
    with pytest.raises(ValueError, match="repair rate"):
        with_repairs(p.job.scenario, p.result, 1.5, np.random.default_rng(0))


@real_tokenizer
def test_a_repaired_negotiation_is_the_one_the_protocol_plays_and_only_its_valid_replies_are_trained(converted):
    """Replay each repaired negotiation through the protocol with a chat negotiator that writes its replies, invalid
    ones included: the protocol judges them as recorded and sends the recorded feedback; the messages the model
    receives are, turn by turn, the prefix of the cloned sequence; the ids trained are the valid replies', and the
    same as without repairs."""
    from nego.agents.llm.backends.hf import chat_ids
    from nego.training.chat_warm_start import chat_examples
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted[1])
    tmpl = load_template(SMALL)
    played = _played(4)
    plain = chat_examples(tok, played, SMALL)
    examples = chat_examples(tok, played, SMALL, repairs=0.5, seed=3)
    rng = np.random.default_rng([3, 7])  # the draws chat_examples makes, in its order
    repaired_any = False
    for p, example, before in zip(played, examples, plain, strict=True):
        repaired = with_repairs(p.job.scenario, p.result, 0.5, rng, prompt_id=tmpl.id, line=True)
        seller_turns = [t for t in repaired.turns if t.role is Role.SELLER]
        repaired_any |= any(not t.valid for t in seller_turns)
        replies = [reply_text(t.action, line=True) for t in seller_turns]
        backend = ReplayBackend(replies)

        def resolver(spec, factory=ReplayFactory(backend, tmpl)):
            return factory if spec == "replay" else resolve(spec)

        again = run_jobs(resolver, [replace(p.job, seller="replay", negotiation_id="")])[0]
        assert [(t.role, t.attempt, t.valid, t.feedback) for t in again.turns] == [
            (t.role, t.attempt, t.valid, t.feedback) for t in repaired.turns
        ]
        assert again.outcome.seller_utility == p.result.outcome.seller_utility
        for messages, turn, reply in zip(backend.requests, seller_turns, replies, strict=True):
            prompt = chat_ids(tok, messages)
            assert list(example.ids[: len(prompt)]) == prompt
            n = len(tok.encode(reply, add_special_tokens=False)) + 1
            assert set(example.mask[len(prompt) : len(prompt) + n]) == ({1} if turn.valid else {0})
        assert sum(example.mask) == sum(before.mask)
    assert repaired_any


def test_offers_keep_their_json_form_when_corrupted():
    p = _played(1)[0]
    offer = next(t.action for t in p.result.turns if t.action.kind is ActionKind.OFFER)
    body = action_to_json(offer)
    wrong = corrupt_offer(body, p.job.scenario.issues, np.random.default_rng(0))
    assert wrong["action"] == "offer" and wrong["message"] == body["message"] and body == action_to_json(offer)
