"""Chat turns generated through TRL's vLLM (``trainer.vllm_generation``, colocated or on a ``trl vllm-serve``
server), one capped turn at a time, with every training process kept in step.

Each call generates one turn for a batch of negotiations: at most the per-turn cap of new tokens (TRL's own cap,
``max_completion_length``, is the whole episode's and is set aside for the call) and a stop at every end-of-text id
of the model. vLLM samples at the trainer's temperature with its own seeds, not per negotiation.

With several training processes TRL's server mode gathers the prompts of all processes, generates them in the main
one and hands process ``i`` the results ``i * len(prompts)`` onward: every process must make the same number of
calls with the same number of prompts. Negotiations end at different turns in different processes, so a
:class:`Lockstep` first agrees on the largest batch among the processes (every process pads its own with one-token
filler prompts and drops their completions), and a process whose negotiations have all ended keeps joining the
others' calls with filler only until every process is done (:meth:`VLLMTurns.drain`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from nego.agents.batching import Batcher
from nego.agents.llm.backends.base import BackendError
from nego.agents.llm.backends.hf_engine import Generated


class Lockstep:
    """Keeps the generation calls of every training process in step: ``gather`` is an all-gather of Python lists
    (``accelerate.utils.gather_object``), called once per generation call by every process."""

    def __init__(self, gather: Callable[[list[int]], list[int]], filler: Sequence[int]) -> None:
        self.gather = gather
        self.filler = list(filler)
        self.calls = 0
        self.broken = False

    def rows(self, n: int) -> int:
        """The number of prompts every process sends in this call (the largest ``n`` of all processes; 0 when every
        process is done)."""
        try:
            counts = self.gather([n])
        except BaseException:
            self.broken = True  # a failed collective leaves the others out of step: never drain after it
            raise
        self.calls += 1
        return max(counts)

    def pad(self, rows: list[list[int]]) -> list[list[int]]:
        """``rows`` padded with filler prompts to the batch size every process agrees on."""
        return rows + [self.filler] * (self.rows(len(rows)) - len(rows))


@contextlib.contextmanager
def turn_settings(vllm: Any, max_new: int, stop_ids: Sequence[int]) -> Iterator[None]:
    """TRL's vLLM generation set to one capped turn that stops at every id in ``stop_ids``; restored afterwards."""
    cap, kwargs = vllm.max_completion_length, vllm.generation_kwargs
    vllm.max_completion_length = max_new
    vllm.generation_kwargs = {**(kwargs or {}), "stop_token_ids": list(stop_ids)}
    try:
        yield
    finally:
        vllm.max_completion_length, vllm.generation_kwargs = cap, kwargs


@dataclass(frozen=True, slots=True)
class _Turn:
    ids: tuple[int, ...]
    max_new: int


class VLLMTurns:
    """Generates chat turns of at most ``max_new`` tokens through TRL's ``VLLMGeneration``; negotiations waiting at the
    same time share a call. ``generate`` has the signature of :meth:`nego.agents.llm.backends.hf.HFBackend.generate`; a
    request may ask for fewer tokens, never more, and sampling (temperature, seeds) is the trainer's own: every call of
    every process uses the same settings, since in server mode the main process's apply to all."""

    def __init__(
        self,
        vllm: Any,
        *,
        max_new: int,
        eos_ids: Sequence[int],
        lockstep: Lockstep | None = None,
        window_ms: float = 5.0,
    ) -> None:
        self.vllm = vllm
        self.max_new = max_new
        self.eos_ids = tuple(eos_ids)
        self.lockstep = lockstep
        self.calls = 0
        self.filler_rows = 0
        """Prompts this process sent only to keep in step with the others (their completions are dropped)."""
        self._batcher: Batcher[_Turn, Generated] = Batcher(
            self._run,
            max_batch=2**31,
            window_s=window_ms / 1000,
            failure=lambda e: BackendError(f"vLLM generation failed: {type(e).__name__}: {e}"),
            in_thread=False,  # the collectives of every call run on the event loop's thread, one call at a time
            name="vllm-turns",
        )

    async def generate(self, ids: Sequence[int], max_new: int, temperature: float, seed: int | None) -> Generated:
        if max_new > self.max_new:
            raise ValueError(f"a turn of {max_new} new tokens exceeds this generator's cap of {self.max_new}")
        result, _ = await self._batcher.submit(_Turn(tuple(ids), max_new))
        return result

    def drain(self) -> int:
        """After this process's last turn: join the other processes' calls with filler until all are done (the
        number of calls joined). Without a lockstep, or after a failed collective, there is nothing to join."""
        if self.lockstep is None or self.lockstep.broken:
            return 0
        joined = 0
        while n := self.lockstep.rows(0):
            self._call([self.lockstep.filler] * n)
            self.filler_rows += n
            joined += 1
        return joined

    async def aclose(self) -> None:
        await self._batcher.aclose(BackendError("vLLM turn generation closed"))

    def _run(self, turns: list[_Turn]) -> list[Generated]:
        rows = [list(t.ids) for t in turns]
        if self.lockstep is not None:
            rows = self.lockstep.pad(rows)
            self.filler_rows += len(rows) - len(turns)
        completions = self._call(rows)[: len(turns)]
        return [_cut(g, t.max_new) for g, t in zip(completions, turns, strict=True)]

    def _call(self, rows: list[list[int]]) -> list[Generated]:
        with turn_settings(self.vllm, self.max_new, self.eos_ids):
            _, completions, logprobs, _ = self.vllm.generate(rows, None, 1)
        self.calls += 1
        out = []
        for ids, lps in zip(completions, logprobs or [None] * len(completions), strict=True):
            values = [_first(lp) for lp in lps] if lps is not None else [math.nan] * len(ids)
            stopped = bool(ids) and ids[-1] in self.eos_ids
            out.append(Generated(tuple(int(i) for i in ids), tuple(values), stopped))
        return out


def _cut(generated: Generated, max_new: int) -> Generated:
    """A completion held to a request's own (smaller) cap."""
    if len(generated.ids) <= max_new:
        return generated
    return Generated(generated.ids[:max_new], generated.logprobs[:max_new], False)


def _first(logprobs: Any) -> float:
    """The sampled token's log-probability from vLLM's per-token list (None, which vLLM sends for NaN, as NaN)."""
    value = logprobs[0] if isinstance(logprobs, (list, tuple)) else logprobs
    return math.nan if value is None else float(value)
