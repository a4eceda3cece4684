"""Decoding helpers of the in-process backend: per-row seeded sampling and a store of prompt states for reuse.

Neither imports torch at module level: the backend hands them its torch module and tensors.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from typing import Any


class RowSampler:
    """Picks each row's next token: greedy for temperature 0, else a draw from the row's own seeded generator.

    Also a logits processor for ``generate``: a sampled row's chosen token is the only one left, so the greedy
    step that follows takes it.
    """

    def __init__(self, torch: Any, rows: list[tuple[float, int | None]], device: Any) -> None:
        self.torch = torch
        self.first_call_at: float | None = None
        self.sampled = [row for row, (t, _) in enumerate(rows) if t > 0]
        self.temperatures = torch.tensor([[rows[row][0]] for row in self.sampled], device=device)
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

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.first_call_at is None:
            self.first_call_at = time.perf_counter()
        if not self.sampled:
            return scores
        picked = self.pick(scores)
        out = scores.clone()
        out[self.sampled] = float("-inf")
        out[self.sampled, picked[self.sampled]] = 0.0
        return out


class PrefixCache:
    """The states of recently read prompts, so a prompt that starts like one read before reads only what is new.

    Only whole chunks are kept and reused (see ``HFBackend._prefill``). Bounded in bytes; the least recently
    used entry goes first.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.used = 0
        self.entries: OrderedDict[tuple[int, ...], list[tuple[Any, Any]]] = OrderedDict()

    def lookup(self, ids: list[int], chunk: int) -> tuple[int, list[tuple[Any, Any]]]:
        """How many leading tokens of ``ids`` can be reused (whole chunks, always leaving one to read), and the
        states holding them."""
        best, best_key = 0, None
        for key in self.entries:
            n = common_prefix(key, ids)
            if n > best:
                best, best_key = n, key
        usable = min(best, len(ids) - 1) // chunk * chunk
        if best_key is None or usable == 0:
            return 0, []
        self.entries.move_to_end(best_key)
        return usable, self.entries[best_key]

    def store(self, ids: list[int], kv: list[tuple[Any, Any]], chunk: int) -> None:
        whole = len(ids) // chunk * chunk
        key = tuple(ids[:whole])
        if whole == 0 or key in self.entries:
            return
        kept = [(k[:, :, :whole].clone(), v[:, :, :whole].clone()) for k, v in kv]
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kept)
        if size > self.budget:
            return
        self.entries[key] = kept
        self.used += size
        while self.used > self.budget:
            _, dropped = self.entries.popitem(last=False)
            self.used -= sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in dropped)


def common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
