"""A stand-in chat tokenizer for checkpoints built from published shapes (no download): byte-level BPE trained on
negotiation text, with Gemma-style turn markers.

The chat template has the shape of Gemma's: ``<start_of_turn>user`` / ``<start_of_turn>model`` turns closed by
``<end_of_turn>`` (the EOS token), the system message folded into the first user turn, and a generation prompt
that opens a model turn. It is prefix-preserving turn by turn, as the chat rollout requires. Its token counts are
those of a small domain vocabulary, not of Gemma's 262k-token one: use it for plumbing, smoke runs and benchmarks
of shapes, and the real tokenizer for episode-length plans.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

NAME = "stand-in Gemma-style BPE"
BOS, EOS, PAD = "<bos>", "<end_of_turn>", "<pad>"
START = "<start_of_turn>"
SPECIAL_TOKENS = (PAD, EOS, BOS, START)
GEMMA_STYLE_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set first = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set first = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ first if loop.first else '' }}{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def negotiation_corpus(n_scenarios: int = 24, seed_split: str = "dev") -> list[str]:
    """Texts a chat seller reads and writes: first prompts (system and user messages) of generated scenarios, for
    both openers, and JSON action replies with their values."""
    from nego.agents.llm.parsing import action_to_json
    from nego.agents.llm.prompts import DEFAULT_TEMPLATE, load_template
    from nego.market.types import Action, Observation, Offer
    from nego.scenarios.scenario import Role

    from .rollout import split_scenarios

    template = load_template(DEFAULT_TEMPLATE)
    texts: list[str] = []
    for scenario in split_scenarios(seed_split, n_scenarios):
        view = scenario.view_for(Role.SELLER)
        obs = Observation(scenario=view, history=(), round=1, standing_offer=None)
        texts.extend(m.content for m in template.render(obs, tools=False))
        offer = Offer({i.name: i.options[0] if i.options else i.low for i in scenario.issues})
        texts.append("```json\n" + json.dumps(action_to_json(Action.make_offer(offer, "Here is my offer."))) + "\n```")
    return texts


def gemma_style_tokenizer(corpus: Iterable[str] | None = None, vocab_size: int = 2000) -> Any:
    """A ``PreTrainedTokenizerFast`` with the Gemma-style chat template, trained on ``corpus`` (default:
    :func:`negotiation_corpus`); EOS is ``<end_of_turn>``, padding is on the left (for batched generation)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(list(corpus) if corpus is not None else negotiation_corpus(), trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, padding_side="left"
    )
    tok.chat_template = GEMMA_STYLE_TEMPLATE
    tok.name_or_path = NAME
    return tok
