"""Decoding helpers of the in-process backend: per-row seeded sampling and a store of prompt states for reuse.

Neither imports torch at module level: the backend hands them its torch module and tensors.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


class RowSampler:
    """Picks each row's next token: greedy for temperature 0, else a draw from the row's own seeded generator; and
    gives the log-probability of a chosen token under ``softmax(logits / T)`` (``T`` = 1 for greedy rows).

    Also a logits processor for ``generate``: a sampled row's chosen token is the only one left, so the greedy
    step that follows takes it; the log-probabilities of each step's chosen tokens are kept in ``chosen_logprobs``.
    """

    def __init__(self, torch: Any, rows: list[tuple[float, int | None]], device: Any) -> None:
        self.torch = torch
        self.first_call_at: float | None = None
        self.chosen_logprobs: list[Any] = []
        self.sampled = [row for row, (t, _) in enumerate(rows) if t > 0]
        self.temperatures = torch.tensor([[rows[row][0]] for row in self.sampled], device=device)
        self.row_temperatures = torch.tensor([[t if t > 0 else 1.0] for t, _ in rows], device=device)
        self.generators = []
        for row in self.sampled:
            seed = rows[row][1]
            gen = torch.Generator(device=device)
            gen.manual_seed(seed if seed is not None else secrets.randbits(63))
            self.generators.append(gen)

    def pick(self, logits: Any) -> Any:
        """The next token of every row (``logits`` is [rows, vocab])."""
        torch = self.torch
        picked = logits.argmax(dim=-1)
        if self.sampled:
            # an exponential race, argmax of p / E with E ~ Exp(1) drawn from the row's generator, is what
            # torch.multinomial does for one draw; only the noise is drawn per row, the rest runs for all rows at
            # once. (Inverse-CDF sampling needs one draw per row, but the last-bit differences in logits between
            # batch sizes move its answer at any of the vocabulary's boundaries, so outputs would depend on the batch.)
            probs = torch.softmax(logits[self.sampled].float() / self.temperatures, dim=-1)
            noise = torch.empty_like(probs)
            for row, gen in enumerate(self.generators):
                noise[row].exponential_(generator=gen)
            picked[self.sampled] = (probs / noise).argmax(dim=-1)
        return picked

    def logprobs(self, logits: Any, picked: Any) -> Any:
        """The log-probability of each row's ``picked`` token under ``softmax(logits / T)``, as float32 ([rows])."""
        logp = self.torch.log_softmax(logits.float() / self.row_temperatures, dim=-1)
        return logp.gather(1, picked[:, None])[:, 0]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.first_call_at is None:
            self.first_call_at = time.perf_counter()
        picked = self.pick(scores)
        self.chosen_logprobs.append(self.logprobs(scores, picked))
        if not self.sampled:
            return scores
        out = scores.clone()
        out[self.sampled] = float("-inf")
        out[self.sampled, picked[self.sampled]] = 0.0
        return out


@dataclass(frozen=True, slots=True)
class _Block:
    """The states of one chunk of a prompt: each layer's (keys, values) for those positions only."""

    id: int
    kv: list[tuple[Any, Any]]
    size: int


class PrefixCache:
    """The states of recently read prompts, so a prompt that starts like one read before reads only what is new.

    Prompts are stored chunk by chunk (whole chunks only, see ``HFBackend._prefill``); a chunk is found by its
    tokens and the chunk before it, so prompts that share a start (every negotiation's system message opening the
    same way, a later turn repeating an earlier one) share those chunks' states, stored once. Bounded in bytes; the
    least recently used chunk goes first, and since using a chunk also uses every chunk before it, a prompt's last
    chunks go before its first ones.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.used = 0
        self.blocks: OrderedDict[tuple[int, tuple[int, ...]], _Block] = OrderedDict()
        self._ids = itertools.count(1)

    def lookup(self, ids: list[int], chunk: int) -> list[list[tuple[Any, Any]]]:
        """The stored states of the longest run of whole leading chunks of ``ids``, always leaving one token to
        read: one list of per-layer (keys, values) per chunk, in order."""
        path = self._walk(ids, chunk, len(ids) - 1)
        self._touch(path)
        return [self.blocks[key].kv for key in path]

    def store(self, ids: list[int], kv: list[tuple[Any, Any]], chunk: int) -> None:
        """Keep the states of every whole chunk of ``ids`` (``kv``: each layer's keys and values for all of it)."""
        whole = len(ids) // chunk * chunk
        path = self._walk(ids, chunk, whole)
        parent = self.blocks[path[-1]].id if path else 0
        for start in range(len(path) * chunk, whole, chunk):
            kept = [(k[:, :, start : start + chunk].clone(), v[:, :, start : start + chunk].clone()) for k, v in kv]
            size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kept)
            if size > self.budget:
                break
            key = (parent, tuple(ids[start : start + chunk]))
            block = _Block(next(self._ids), kept, size)
            self.blocks[key] = block
            self.used += size
            path.append(key)
            parent = block.id
        self._touch(path)
        while self.used > self.budget:
            _, dropped = self.blocks.popitem(last=False)
            self.used -= dropped.size

    def _walk(self, ids: list[int], chunk: int, limit: int) -> list[tuple[int, tuple[int, ...]]]:
        """The keys of the stored chunks that ``ids[:limit]`` starts with, in order."""
        keys: list[tuple[int, tuple[int, ...]]] = []
        parent = 0
        for end in range(chunk, limit + 1, chunk):
            key = (parent, tuple(ids[end - chunk : end]))
            block = self.blocks.get(key)
            if block is None:
                break
            keys.append(key)
            parent = block.id
        return keys

    def _touch(self, path: list[tuple[int, tuple[int, ...]]]) -> None:
        # the first chunks end up the most recently used: a later chunk is useless once an earlier one is gone
        for key in reversed(path):
            self.blocks.move_to_end(key)
