"""Tiny chat models for tests, built here (nothing is downloaded): a byte-level BPE tokenizer with a Gemma-style chat
template, and a 2-layer Llama or Gemma 4 text model around it, saved like a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

BOS, EOS, END, START, PAD = "<bos>", "<eos>", "<end_of_turn>", "<start_of_turn>", "<pad>"
GEMMA_STYLE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\\n\\n' %}"
    "{% set turns = messages[1:] %}{% else %}{% set first = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ first if loop.first else '' }}{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
"""Gemma's layout: turn markers around each role, the system text at the start of the first user turn, every
message trimmed, ``<end_of_turn>`` closing a turn (the tokenizer's EOS) and a generation prompt opening a model turn."""


def corpus() -> list[str]:
    """Texts a chat seller reads and writes: first prompts of the chat template and JSON replies."""
    from nego.agents.llm.chat_layout import CHAT_TEMPLATE
    from nego.agents.llm.prompts import load_template
    from nego.market.types import Observation
    from nego.scenarios.generator import generate_scenarios
    from nego.scenarios.scenario import Role

    template = load_template(CHAT_TEMPLATE)
    texts = []
    for scenario in generate_scenarios(3, 5):
        for role in Role:
            obs = Observation(scenario.view_for(role), (), 1, None)
            texts += [m.content for m in template.render(obs, tools=False)]
        offer = {i.name: i.options[0] if i.options else i.low for i in scenario.issues}
        texts.append("```json\n" + json.dumps({"action": "offer", "offer": offer, "message": "A fair deal."}) + "\n```")
    return texts


def gemma_style_tokenizer(vocab_size: int = 600):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, BOS, START, END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=END, pad_token=PAD)
    tok.chat_template = GEMMA_STYLE
    return tok


def tiny_chat_model(path: Path, kind: str = "llama", seed: int = 0) -> Path:
    """A random 2-layer model (``kind`` llama or gemma4) with the Gemma-style tokenizer, saved at ``path``. Its
    generation config lists two end-of-text ids, ``<end_of_turn>`` and ``<eos>``, as Gemma's does."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig, LlamaConfig, LlamaForCausalLM

    tok = gemma_style_tokenizer()
    ids = {name: tok.convert_tokens_to_ids(name) for name in (BOS, EOS, END, PAD)}
    common = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        bos_token_id=ids[BOS],
        eos_token_id=[ids[END], ids[EOS]],
        pad_token_id=ids[PAD],
        initializer_range=0.2,
    )
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=8192, **common))
    elif kind == "gemma4":
        config = Gemma4TextConfig(
            head_dim=16,
            global_head_dim=16,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=64,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=len(tok),
            max_position_embeddings=8192,
            **common,
        )
        model = Gemma4ForCausalLM(config)
    else:
        raise ValueError(f"kind must be llama or gemma4, got {kind!r}")
    model.generation_config.eos_token_id = [ids[END], ids[EOS]]
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
