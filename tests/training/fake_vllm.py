"""A fake vLLM server behind TRL's own ``VLLMGeneration``: TRL's server-mode code runs as it is (prompts gathered
from every process, generated in the main one, results broadcast and sliced by ``process_index * len(prompts)``);
only the HTTP client is replaced by :class:`FakeVLLMClient`, which answers like ``trl vllm-serve``."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Call:
    """One generation request the server saw: how many prompts, the cap on new tokens, the stop ids."""

    prompts: int
    max_tokens: int
    stop_token_ids: tuple[int, ...]


@dataclass
class FakeVLLMClient:
    """Completes each prompt with ``reply(prompt ids)``, cut at ``max_tokens`` and after the first stop id (as vLLM
    keeps the stop id), every token at log-probability -0.5; records every call."""

    reply: Callable[[list[int]], list[int]]
    calls: list[Call] = field(default_factory=list)

    def generate(self, prompts: Sequence[Sequence[int]], features: Any = None, n: int = 1, **params: Any) -> dict:
        stop = set((params.get("generation_kwargs") or {}).get("stop_token_ids", ()))
        max_tokens = int(params["max_tokens"])
        self.calls.append(Call(len(prompts), max_tokens, tuple(sorted(stop))))
        completions = []
        for prompt in prompts:
            for _ in range(n):
                out: list[int] = []
                for token in self.reply(list(prompt)):
                    if len(out) == max_tokens:
                        break
                    out.append(token)
                    if token in stop:
                        break
                completions.append(out)
        return {
            "prompt_ids": [list(p) for p in prompts],
            "completion_ids": completions,
            "logprobs": [[[-0.5] for _ in c] for c in completions],
            "logprob_token_ids": [[[t] for t in c] for c in completions],
        }


def fake_vllm_generation(accelerator: Any, tokenizer: Any, client: FakeVLLMClient, *, max_completion_length: int):
    """TRL's ``VLLMGeneration`` in server mode, talking to ``client`` instead of a server."""
    from trl.generation.vllm_generation import VLLMGeneration

    class ServedByFake(VLLMGeneration):
        def _init_vllm(self) -> None:
            self.vllm_client = client

    return ServedByFake(
        None, accelerator, tokenizer, mode="server", max_completion_length=max_completion_length, temperature=1.0
    )


def reply_for(tokenizer: Any, end_id: int) -> Callable[[list[int]], list[int]]:
    """A reply that names the prompt it answers (a hash of its ids): an acceptance for one prompt in three (valid
    once the other side has an offer on the table, so negotiations end at different turns), otherwise text that is
    no action at all; then ``end_id``."""

    def reply(prompt: list[int]) -> list[int]:
        tag = zlib.crc32(repr(prompt).encode())
        text = f'{{"action": "accept", "message": "h{tag}"}}' if tag % 3 == 0 else f"h{tag}"
        return [*tokenizer.encode(text, add_special_tokens=False), end_id]

    return reply
