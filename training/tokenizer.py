"""The compact protocol's fixed word-level tokenizer, saved as a ``PreTrainedTokenizerFast``.

Every word of :func:`nego.agents.compact.protocol.vocabulary` is one token; nothing is learned from data, so any
generated scenario (any number of issues up to the weight tokens, any issue kind) is expressible and the
tokenizer loads back through the normal transformers path.
"""

from __future__ import annotations

from typing import Any

from nego.agents.compact.protocol import BOS, EOS, PAD, UNK, vocabulary


def build_tokenizer(aims: bool = False) -> Any:
    """A word-level tokenizer over the compact vocabulary (whitespace-separated words, left padding); ``aims`` adds
    the aim words, for a model that offers by own utility."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(vocabulary(aims))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
