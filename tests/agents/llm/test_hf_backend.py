"""The in-process transformers backend on tiny models built here: batching on both generation paths, prefix
reuse, seeds, usage, loading errors."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("transformers")

from nego.agents.llm.backends.base import BackendError, ChatBackend, ChatMessage, ChatRequest, ToolSpec
from nego.agents.llm.backends.hf import HFBackend

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_chat_model(path: Path, chat_template: str = CHAT_TEMPLATE, sliding_window: int | None = None) -> Path:
    """A byte-level BPE tokenizer with a chat template and a 2-layer Llama (hidden 32), saved like a checkpoint;
    with ``sliding_window``, a Mistral of the same size whose layers attend only to that many recent tokens.

    Weights are drawn wider than usual (std 0.5) so next-token distributions are peaked like a trained
    model's, rather than nearly uniform, which is what greedy decoding meets in practice.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(['The seller offers price 120, quantity 5. {"action": "offer"}'] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|end|>", pad_token="<pad>")
    fast.chat_template = chat_template
    torch.manual_seed(0)
    kind, extra = (LlamaConfig, {}) if sliding_window is None else (MistralConfig, {"sliding_window": sliding_window})
    config = kind(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        initializer_range=0.5,
        **extra,
    )
    (LlamaForCausalLM if sliding_window is None else MistralForCausalLM)(config).save_pretrained(path)
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


def request(i: int, temperature: float, max_tokens: int = 10) -> ChatRequest:
    messages = (ChatMessage("system", "You sell widgets."), ChatMessage("user", "What is your offer? " * (1 + i % 4)))
    return ChatRequest(messages, max_tokens=max_tokens, temperature=temperature, seed=100 + i)


@pytest.fixture(scope="module")
def sliding_model(tmp_path_factory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-sliding"), sliding_window=16)


PATHS = {
    "split": {},
    "split, no prefix reuse": {"prefix_cache_mb": 0},
    "split, chunk 7": {"prefill_chunk": 7},
    "generate, static cache": {"split_prefill": False, "static_cache": True},
    "generate, dynamic cache": {"split_prefill": False, "static_cache": False},
}


@pytest.mark.parametrize("options", PATHS.values(), ids=PATHS.keys())
async def test_batched_generation_equals_one_at_a_time_with_the_same_seeds(tiny_model, options):
    backend = HFBackend.from_spec(str(tiny_model), max_batch=8, **options)
    assert backend.split_prefill == options.get("split_prefill", True)
    # prompts of different lengths (left padding), greedy and sampled rows and different lengths in one batch
    requests = [request(i, temperature=(0.0, 0.8, 1.3)[i % 3], max_tokens=6 + i) for i in range(8)]
    try:
        alone = [await backend.complete(r) for r in requests]
        assert backend.stats.generate_calls == 8
        together = await asyncio.gather(*(backend.complete(r) for r in requests))
    finally:
        await backend.aclose()
    assert [r.text for r in together] == [r.text for r in alone]
    assert [r.usage.completion_tokens for r in together] == [r.usage.completion_tokens for r in alone]
    assert backend.stats.generate_calls - len(requests) < len(requests) and backend.stats.largest_batch > 1
    assert len({r.text for r in alone}) > 1  # the model does produce different completions


async def test_a_later_turn_reuses_the_earlier_prompt_and_answers_exactly_as_without_reuse(tiny_model):
    reusing = HFBackend.from_spec(str(tiny_model), prefill_chunk=4)
    fresh = HFBackend.from_spec(str(tiny_model), prefill_chunk=4, prefix_cache_mb=0)
    system = ChatMessage("system", "You sell widgets. Price 120, quantity 5. " * 3)
    turns = [(system, ChatMessage("user", f"Round {k}: what is your offer? " * k)) for k in (1, 2, 3)]
    texts: dict[str, list[str]] = {"reusing": [], "fresh": []}
    try:
        for name, backend in (("reusing", reusing), ("fresh", fresh)):
            for k, messages in enumerate(turns):
                reply = await backend.complete(ChatRequest(messages, max_tokens=8, temperature=0.9, seed=k))
                texts[name].append(reply.text)
    finally:
        await reusing.aclose()
        await fresh.aclose()
    assert texts["reusing"] == texts["fresh"]
    assert reusing.stats.prompt_tokens_reused >= 2 * len(reusing.encode((system,)))
    assert fresh.stats.prompt_tokens_reused == 0


async def test_forgetting_the_stored_prompts_frees_them_and_changes_no_reply(tiny_model):
    backend = HFBackend.from_spec(str(tiny_model), prefill_chunk=4)
    messages = (ChatMessage("system", "You sell widgets. Price 120, quantity 5. " * 3), ChatMessage("user", "Go."))
    ask = ChatRequest(messages, max_tokens=8, temperature=0.9, seed=3)
    try:
        first = await backend.complete(ask)
        store = backend.engine.prefixes
        assert store.used > 0 and store.blocks
        backend.forget_prompts()
        assert backend.engine.prefixes.used == 0 and not backend.engine.prefixes.blocks
        assert backend.engine.prefixes.budget == store.budget
        reused = backend.stats.prompt_tokens_reused
        again = await backend.complete(ask)
    finally:
        await backend.aclose()
    assert again.text == first.text
    assert backend.stats.prompt_tokens_reused == reused  # read whole again: nothing was left to reuse


@pytest.fixture(scope="module")
def prefill_pair(tiny_model):
    return (
        HFBackend.from_spec(str(tiny_model), prefill_chunk=5),
        HFBackend.from_spec(str(tiny_model), prefill_chunk=5, prefix_cache_mb=0),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefix=st.lists(st.integers(6, 300), min_size=1, max_size=30),
    first=st.lists(st.integers(6, 300), max_size=12),
    second=st.lists(st.integers(6, 300), max_size=12),
)
def test_reading_a_prompt_after_a_cached_prefix_is_bit_identical_to_reading_it_whole(
    prefill_pair, prefix, first, second
):
    import torch

    reusing, fresh = prefill_pair
    with torch.inference_mode():
        reusing.engine._prefill(prefix + first)
        got, want = reusing.engine._prefill(prefix + second), fresh.engine._prefill(prefix + second)
    assert got.length == want.length == len(prefix) + len(second)
    assert torch.equal(got.logits, want.logits)
    for (gk, gv), (wk, wv) in zip(got.kv, want.kv, strict=True):
        assert torch.equal(gk, wk) and torch.equal(gv, wv)


async def test_concurrent_negotiations_reuse_their_shared_opening_stored_once(tiny_model):
    backend = HFBackend.from_spec(str(tiny_model), prefill_chunk=4, max_batch=4)
    opening = "Rules of the game: offer, accept or walk away. Reply in JSON. " * 2
    prompts = [
        (ChatMessage("system", opening + f"You sell {what}."), ChatMessage("user", "Your move."))
        for what in ("widgets", "gadgets", "sprockets")
    ]
    encoded = [backend.encode(p) for p in prompts]
    same = itertools.takewhile(lambda column: len(set(column)) == 1, zip(*encoded, strict=False))
    shared = sum(1 for _ in same) // 4 * 4
    assert shared >= 16
    try:
        await backend.complete(ChatRequest(prompts[0], max_tokens=2, temperature=0.0))
        await asyncio.gather(*(backend.complete(ChatRequest(p, max_tokens=2, temperature=0.0)) for p in prompts[1:]))
    finally:
        await backend.aclose()
    assert backend.stats.prompt_tokens_reused == 2 * shared
    cache = backend.engine.prefixes
    whole = [len(ids) // 4 for ids in encoded]
    distinct = sum(whole) - 2 * (shared // 4)  # the shared opening's chunks are kept once, not three times
    assert distinct == len({tuple(ids[:end]) for ids in encoded for end in range(4, len(ids) + 1, 4)})
    block = cache.used // len(cache.blocks)
    assert len(cache.blocks) == distinct and cache.used == distinct * block


def test_over_budget_a_prompts_last_chunks_go_before_its_shared_first_ones():
    import torch
    from nego.agents.llm.backends.hf_decoding import PrefixCache

    def states(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.randn(1, 2, n, 3), torch.randn(1, 2, n, 3))]

    block = 2 * 2 * 2 * 3 * 4  # one chunk of 2 tokens: keys and values, 2 heads x 3 dims, float32
    cache = PrefixCache(budget_bytes=5 * block)
    a, b = [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9]
    cache.store(a, states(8), chunk=2)
    assert len(cache.lookup([*a, 0], 2)) == 4 and cache.used == 4 * block
    cache.store(b, states(8), chunk=2)  # shares two chunks with a: two new ones, one of a's over the budget
    assert cache.used == 5 * block
    assert len(cache.lookup([*b, 0], 2)) == 4  # the newest prompt whole
    assert len(cache.lookup([*a, 0], 2)) == 3  # a lost its last chunk only
    assert len(cache.lookup([1, 2, 3, 4, 0], 2)) == 2  # the shared opening stays
    assert len(cache.lookup([1, 2], 2)) == 0  # one token is always left to read


async def test_a_sliding_window_model_takes_the_generate_path_and_still_batches_exactly(sliding_model):
    with pytest.raises(BackendError, match=r"split_prefill is not possible: .*sliding window"):
        HFBackend.from_spec(str(sliding_model), split_prefill=True)
    backend = HFBackend.from_spec(str(sliding_model), max_batch=4)
    assert not backend.split_prefill
    requests = [request(i, temperature=(0.0, 1.1)[i % 2], max_tokens=20) for i in range(4)]
    try:
        alone = [await backend.complete(r) for r in requests]
        together = await asyncio.gather(*(backend.complete(r) for r in requests))
    finally:
        await backend.aclose()
    assert [r.text for r in together] == [r.text for r in alone]
    assert backend.stats.largest_batch > 1 and backend.stats.prompt_tokens_reused == 0


async def test_sampling_follows_the_seed_and_usage_counts_tokens(tiny_model):
    backend = HFBackend.from_spec(str(tiny_model))
    r = request(0, temperature=1.0, max_tokens=12)
    try:
        first, again = await backend.complete(r), await backend.complete(r)
        others = await asyncio.gather(*(backend.complete(dataclasses.replace(r, seed=s)) for s in range(5)))
    finally:
        await backend.aclose()
    assert first.text == again.text
    assert len({o.text for o in others}) > 1
    assert first.usage.prompt_tokens == len(backend.encode(r.messages)) and first.usage.calls == 1
    assert 1 <= first.usage.completion_tokens <= 12 and first.usage.latency_s > 0
    assert backend.stats.prefill_s > 0 and backend.stats.decode_s > 0


def test_sampling_draws_from_the_tempered_distribution_and_never_a_masked_token():
    import torch
    from nego.agents.llm.backends.hf_decoding import RowSampler

    logits = torch.tensor([[0.0, 1.0, 2.0, float("-inf")], [3.0, 0.0, 0.0, 0.0]])
    sampler = RowSampler(torch, [(2.0, 7), (0.0, None)], "cpu")
    picks = torch.stack([sampler.pick(logits) for _ in range(4000)])
    assert (picks[:, 1] == 0).all()  # temperature 0 is greedy
    freq = torch.bincount(picks[:, 0], minlength=4).float() / len(picks)
    assert freq[3] == 0
    assert torch.allclose(freq, torch.softmax(logits[0] / 2.0, dim=-1), atol=0.03)


async def test_the_event_loop_keeps_running_while_the_model_generates(tiny_model):
    backend = HFBackend.from_spec(str(tiny_model))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.0005)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        await backend.complete(request(1, 0.0, max_tokens=60))
    finally:
        task.cancel()
        await backend.aclose()
    assert ticks > 0


async def test_refusals_and_close(tiny_model):
    backend = HFBackend.from_spec(str(tiny_model), window_ms=50)
    assert isinstance(backend, ChatBackend) and backend.kind == "hf" and backend.model == str(tiny_model)
    tool = ToolSpec("accept", "accept the standing offer", {"type": "object", "properties": {}})
    with pytest.raises(BackendError, match="answers in text"):
        await backend.complete(ChatRequest(request(0, 0.0).messages, tools=(tool,)))
    await backend.aclose()
    assert backend.stats.generate_calls == 0


def test_a_template_without_a_system_role_gets_the_system_text_in_the_first_user_turn(tmp_path):
    backend = HFBackend.from_spec(str(build_tiny_chat_model(tmp_path, NO_SYSTEM_TEMPLATE)))
    ids = backend.encode((ChatMessage("system", "RULES"), ChatMessage("user", "hello")))
    assert backend.tokenizer.decode(ids) == "<|user|>RULES\n\nhello<|end|><|assistant|>"


def test_loading_errors_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(BackendError, match="no model directory at"):
        HFBackend.from_spec(str(tmp_path / "missing"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BackendError, match=r"HF_HUB_OFFLINE is set.*hf download nego-test/not-a-model"):
        HFBackend.from_spec("nego-test/not-a-model")
    with pytest.raises(ValueError, match="dtype must be one of"):
        HFBackend.from_spec(str(tmp_path), dtype="int3")


def test_a_lora_adapter_directory_loads_on_its_base_with_the_adapter_folded_in(tiny_model, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():  # a trained adapter: B starts at zero, which would leave the base unchanged
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    adapter = tmp_path / "toy-rl"
    peft_model.save_pretrained(adapter)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(adapter)
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tiny_model)(input_ids=ids).logits
        got = HFBackend.from_spec(str(adapter)).lm(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-4) and not torch.allclose(got, plain, atol=1e-3)

    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    with pytest.raises(BackendError, match="base_model_name_or_path"):
        HFBackend.from_spec(str(adapter))
