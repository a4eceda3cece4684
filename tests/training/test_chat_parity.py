"""Train/serve parity for chat models: the token ids a model is trained on at each seller turn are exactly the prompt
it receives when it is played, in process and through an OpenAI-compatible server; every trained id was sampled in
that very context, with the log-probability the trainer recomputes; generation stops at every end-of-text id and
each turn is capped."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from nego.agents.llm.backends.base import ChatMessage
from nego.agents.llm.backends.hf import HFBackend, chat_ids
from nego.agents.llm.backends.hf_engine import Generated
from nego.agents.llm.backends.limits import RetryPolicy
from nego.agents.llm.backends.openai_backend import OpenAIBackend
from nego.agents.llm.chat_layout import CHAT_TEMPLATE
from nego.agents.llm.negotiator import LLMNegotiator
from nego.agents.registry import resolve
from nego.market.protocol import ProtocolConfig, run_negotiation
from nego.market.types import NegotiationResult
from nego.scenarios.scenario import Role
from nego.training.chat_rollout import ChatNegotiator, ChatPolicy
from nego.training.rollout import split_scenarios

from ..conftest import make_widget_scenario
from ..fakes.llm_server import Fault, serve
from .chat_models import END, EOS, tiny_chat_model

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
FAST = RetryPolicy(max_attempts=1, base_delay_s=0.001, max_delay_s=0.01, timeout_s=10.0)
RULES = ProtocolConfig(max_retries=1)


@pytest.fixture(scope="module", params=["llama", "gemma4"])
def chat_model(request, tmp_path_factory):
    """(model, tokenizer): a Llama (the engine reads prompts alone and decodes them together) and a Gemma 4 with a
    sliding-window layer (one left-padded ``generate`` call), both with the Gemma-style template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_chat_model(tmp_path_factory.mktemp(request.param), request.param)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def sequence(trace) -> list[int]:
    return [*trace.prompt_ids, *trace.completion_ids]


def own_runs(trace) -> list[tuple[int, int]]:
    """(start, end) in the whole sequence of every run of trained ids."""
    runs, start = [], None
    offset = len(trace.prompt_ids)
    for i, m in enumerate([*trace.mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((offset + start, offset + i))
            start = None
    return runs


def record_prompts(backend: HFBackend) -> list[list[int]]:
    """Every prompt ``backend`` encodes from now on, in order."""
    prompts: list[list[int]] = []
    encode = backend.encode

    def recording(messages):
        prompts.append(encode(messages))
        return prompts[-1]

    backend.encode = recording
    return prompts


async def play_trained(policy: ChatPolicy, scenario, temperature: float, seed: int = 7):
    seller = ChatNegotiator(policy, Role.SELLER, seed, temperature)
    result = await run_negotiation(scenario, seller, resolve("tft")(Role.BUYER, 3), seed=1, config=RULES)
    return result, seller.record(result), seller


def same_play(a: NegotiationResult, b: NegotiationResult) -> bool:
    return [(t.role, t.action.kind, t.action.offer, t.action.raw) for t in a.turns] == [
        (t.role, t.action.kind, t.action.offer, t.action.raw) for t in b.turns
    ]


async def test_in_process_the_served_prompt_at_every_turn_is_the_trained_sequence_so_far(chat_model):
    model, tok = chat_model
    for scenario in split_scenarios("dev", 3, 4):
        policy = ChatPolicy(model, tok, max_new=12)
        trained, trace, _ = await play_trained(policy, scenario, 1.0)
        backend = HFBackend(model, tok, name="served")
        served_prompts = record_prompts(backend)
        seller = LLMNegotiator(backend, role=Role.SELLER, seed=7, template=CHAT_TEMPLATE, max_tokens=12, temperature=1)
        served = await run_negotiation(scenario, seller, resolve("tft")(Role.BUYER, 3), seed=1, config=RULES)
        await backend.aclose()
        await policy.aclose()
        # one engine, one sampler, the same seeds: the served model plays the very negotiation it trained on
        assert same_play(trained, served)
        seller_turns = sum(1 for t in trained.turns if t.role is Role.SELLER)
        assert len(served_prompts) == seller_turns >= 4
        full = sequence(trace)
        for prompt in served_prompts:
            assert full[: len(prompt)] == prompt
        assert len({len(p) for p in served_prompts}) == seller_turns  # each turn's prompt extends the last


async def test_trained_ids_were_sampled_in_that_context_with_the_logprob_the_trainer_recomputes(chat_model):
    import torch

    model, tok = chat_model
    policy = ChatPolicy(model, tok, max_new=10)
    temperature = 0.7
    _, trace, _ = await play_trained(policy, split_scenarios("dev", 1, 3)[0], temperature)
    await policy.aclose()
    full = torch.tensor([sequence(trace)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=full).logits[0].float() / temperature, dim=-1)
    offset = len(trace.prompt_ids)
    trained = [i for i, m in enumerate(trace.mask) if m]
    assert len(trained) >= 10
    recomputed = torch.tensor([logp[offset + i - 1, trace.completion_ids[i]].item() for i in trained])
    assert torch.allclose(recomputed, torch.tensor([trace.logprobs[i] for i in trained]), atol=1e-4)
    assert all(trace.logprobs[i] == 0.0 for i, m in enumerate(trace.mask) if not m)
    assert all(end - start <= 10 for start, end in own_runs(trace))  # no turn past its cap
    assert trace.completion_ids[-1] in policy.eos_ids


async def test_generation_stops_at_every_end_id_of_the_generation_config(chat_model):
    model, tok = chat_model
    ends = [tok.convert_tokens_to_ids(END), tok.convert_tokens_to_ids(EOS)]
    assert set(HFBackend(model, tok, name="m").eos_ids) == set(ends)
    prompt = chat_ids(tok, (ChatMessage("user", "Your move."),))
    free = HFBackend(model, tok, name="free")
    free.engine.eos_ids = (len(tok),)  # an id it cannot write: what the model writes with this seed, unstopped
    written = (await free.generate(prompt, 16, 1.0, 5)).ids
    stop_at = next(k for k in range(2, 16) if written[k] not in written[:k])
    model.generation_config.eos_token_id = [ends[0], written[stop_at]]
    try:
        stopping = HFBackend(model, tok, name="stops")
        got = await stopping.generate(prompt, 16, 1.0, 5)
        capped = await stopping.generate(prompt, 2, 1.0, 5)
    finally:
        model.generation_config.eos_token_id = ends
    assert got.ids == tuple(written[: stop_at + 1]) and got.stopped  # a listed id that is not the tokenizer's EOS
    assert capped.ids == tuple(written[:2]) and not capped.stopped and len(capped.logprobs) == 2


@dataclass
class Scripted:
    """A stand-in for the policy's generator that writes scripted replies: the canonical ids of each text, or for a
    text marked ``split`` the same text spelt in single-byte tokens (decoding to the same text)."""

    tokenizer: object
    end_id: int
    replies: list[tuple[str, bool]]
    asked: list[list[int]] = field(default_factory=list)

    async def generate(self, ids, max_new, temperature, seed) -> Generated:
        self.asked.append(list(ids))
        text, split = self.replies[min(len(self.asked), len(self.replies)) - 1]
        out = self.tokenizer.encode(text, add_special_tokens=False)
        if split:
            out = [t for ch in text for t in self.tokenizer.encode(ch, add_special_tokens=False)]
        out = out[:max_new] + ([self.end_id] if len(out) < max_new else [])
        return Generated(tuple(out), tuple(-0.5 for _ in out), out[-1] == self.end_id)

    async def aclose(self) -> None:
        pass


def offer(price: int, message: str = "") -> str:
    action = {"action": "offer", "offer": {"price": price, "quantity": 10, "warranty": "none"}, "message": message}
    return f"```json\n{json.dumps(action)}\n```"


SCRIPT = [
    (offer(150, "Best quality."), False),
    ("Let me think about the price first.", False),  # no action: feedback, a retry in the same round
    (offer(145), True),  # the same kind of text in tokens the tokenizer would never choose
    ("  " + offer(140, "Fine."), False),  # the template trims replies: the leading spaces are not trained
    ("hmm", False),
    ("hmm again", False),  # the turn is lost
    (offer(130, "Last offer."), False),
]


async def test_through_an_openai_server_the_messages_sent_render_to_the_trained_sequence(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_chat_model(tmp_path / "m")
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    scenario = make_widget_scenario(max_rounds=6)
    end_id = tok.convert_tokens_to_ids(END)
    scripted = Scripted(tok, end_id, SCRIPT)
    policy = ChatPolicy(model, tok, max_new=200, generator=scripted)
    trained, trace, learner = await play_trained(policy, scenario, 1.0)
    texts = [e.reply for e in learner.exchanges]
    assert texts[3] == SCRIPT[3][0]  # the reply as the model wrote it, spaces and all
    async with serve(lambda messages: None) as server:
        server.control.faults.extend(Fault(text=t) for t in texts)
        backend = OpenAIBackend("served", kind="vllm", base_url=server.openai_url, supports_tools=False, policy=FAST)
        seller = LLMNegotiator(backend, role=Role.SELLER, seed=7, template=CHAT_TEMPLATE, max_tokens=200, temperature=1)
        served = await run_negotiation(scenario, seller, resolve("tft")(Role.BUYER, 3), seed=1, config=RULES)
        await backend.aclose()
    assert same_play(trained, served) and trained.outcome.forfeits_seller == 1 and trained.outcome.invalid_seller >= 3
    requests = [r.body for r in server.requests]
    assert len(requests) == len(scripted.asked) == len(texts)
    full = sequence(trace)
    for body, asked in zip(requests, scripted.asked, strict=True):
        rendered = chat_ids(tok, tuple(ChatMessage(m["role"], m["content"]) for m in body["messages"]))
        assert rendered == asked == full[: len(rendered)]
        assert body["max_tokens"] == 200
    # trained: the canonical replies whole, with their end-of-turn id; the byte-spelt one not at all; the padded one
    # from the first id the template writes the same way (after the trimmed spaces: none of it)
    runs = [full[a:b] for a, b in own_runs(trace)]
    written = [SCRIPT[min(k, len(SCRIPT) - 1)] for k in range(len(texts))]
    trained = [t for t, split in written if not split and not t.startswith(" ")]
    assert runs == [[*tok.encode(t, add_special_tokens=False), end_id] for t in trained]
    assert policy.context_only_share > 0
