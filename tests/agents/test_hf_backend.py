"""The in-process transformers backend on a tiny model built here: batching, seeds, usage, loading errors."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from nego.agents.backends.base import BackendError, ChatBackend, ChatMessage, ChatRequest, ToolSpec
from nego.agents.backends.hf import HFBackend

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_chat_model(path: Path, chat_template: str = CHAT_TEMPLATE) -> Path:
    """A byte-level BPE tokenizer with a chat template and a 2-layer Llama (hidden 32), saved like a checkpoint.

    Weights are drawn wider than usual (std 0.5) so next-token distributions are peaked like a trained
    model's, rather than nearly uniform, which is what greedy decoding meets in practice.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

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
    config = LlamaConfig(
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
    )
    LlamaForCausalLM(config).save_pretrained(path)
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


def request(i: int, temperature: float, max_tokens: int = 10) -> ChatRequest:
    messages = (ChatMessage("system", "You sell widgets."), ChatMessage("user", "What is your offer? " * (1 + i % 4)))
    return ChatRequest(messages, max_tokens=max_tokens, temperature=temperature, seed=100 + i)


@pytest.mark.parametrize("static_cache", [True, False])
async def test_batched_generation_equals_one_at_a_time_with_the_same_seeds(tiny_model, static_cache):
    backend = HFBackend.from_spec(str(tiny_model), max_batch=8, static_cache=static_cache)
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
