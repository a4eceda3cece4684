"""Decoding helpers of the in-process backend: per-row seeded sampling that no batch mate can sway, and a store of
prompt states for reuse.

Neither imports torch at module level: the backend hands them its torch module and tensors.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nego.agents.token_choice import choose


class RowSampler:
    """Picks each row's next token: greedy for temperature 0, else a draw from the row's own seeded generator; and
    gives the log-probability of a chosen token under ``softmax(logits / T)`` (``T`` = 1 for greedy rows). A close
    choice is made again on the row's logits read alone (:func:`nego.agents.token_choice.choose`), so a row's tokens
    do not depend on the rows batched with it.

    Also a logits processor for ``generate``: every row's chosen token is the only one left, so the greedy step that
    follows takes it; the log-probabilities of each step's chosen tokens are kept in ``chosen_logprobs``, and
    ``alone(row, input_ids)`` (when set) gives a row's logits read alone from the ids ``generate`` has so far.
    """

    def __init__(self, torch: Any, rows: list[tuple[float, int | None]], device: Any) -> None:
        self.torch = torch
        self.first_call_at: float | None = None
        self.chosen_logprobs: list[Any] = []
        self.alone: Callable[[int, Any], Any | None] | None = None
        self.sampled = [row for row, (t, _) in enumerate(rows) if t > 0]
        self.row_temperatures = torch.tensor([[t if t > 0 else 1.0] for t, _ in rows], device=device)
        self.generators = []
        for row in self.sampled:
            seed = rows[row][1]
            gen = torch.Generator(device=device)
            gen.manual_seed(seed if seed is not None else secrets.randbits(63))
            self.generators.append(gen)

    def pick(self, logits: Any, alone: Callable[[int], Any | None] | None = None) -> Any:
        """The next token of every row (``logits`` is [rows, vocab]). A row whose race is close is decided on
        ``alone(row)``, its logits read alone (None: the row needs no token), which then replace its row of
        ``logits`` in place, so :meth:`logprobs` reports what decided it."""
        torch = self.torch
        # an exponential race, argmax of p / E with E ~ Exp(1) drawn from the row's generator, is what
        # torch.multinomial does for one draw; only the noise is drawn per row, the rest runs for all rows at
        # once. (Inverse-CDF sampling would move its answer at any of the vocabulary's boundaries under the
        # last-bit differences in logits between batch sizes; the race moves only when two values nearly tie,
        # and those rows are decided again alone.)
        noise = torch.ones(logits.shape, dtype=torch.float32, device=logits.device)
        for row, gen in zip(self.sampled, self.generators, strict=True):
            noise[row].exponential_(generator=gen)

        def lone(row: int) -> Any | None:
            got = alone(row) if alone is not None else None
            if got is None:
                return None
            logits[row] = got
            return torch.softmax(got.float() / self.row_temperatures[row], dim=-1) / noise[row]

        return choose(torch.softmax(logits.float() / self.row_temperatures, dim=-1) / noise, lone)

    def logprobs(self, logits: Any, picked: Any) -> Any:
        """The log-probability of each row's ``picked`` token under ``softmax(logits / T)``, as float32 ([rows])."""
        logp = self.torch.log_softmax(logits.float() / self.row_temperatures, dim=-1)
        return logp.gather(1, picked[:, None])[:, 0]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.first_call_at is None:
            self.first_call_at = time.perf_counter()
        alone = self.alone
        picked = self.pick(scores, None if alone is None else lambda row: alone(row, input_ids))
        self.chosen_logprobs.append(self.logprobs(scores, picked))
        out = self.torch.full_like(scores, float("-inf"))
        out[self.torch.arange(len(picked), device=scores.device), picked] = 0.0
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
