"""The in-process generation engine for chat models: token ids in, sampled token ids and their log-probabilities out.

Serving (:class:`~nego.agents.llm.backends.hf.HFBackend`) and chat-model training rollouts
(``nego.training.chat_rollout``) both generate through one :class:`GenerationEngine`. A batch of rows is generated
together; each row has its own prompt, its own cap on new tokens, its own temperature and its own seed, and a
row's tokens do not depend on the other rows of its batch: each row draws from its own generator, and a choice close
enough for batch-dependent float rounding to flip is made again on the row's logits read alone (see
:class:`~nego.agents.llm.backends.hf_decoding.RowSampler`). Every row stops at the first of the model's end-of-text ids
(every id its generation config lists, and the tokenizer's), and each chosen token comes with its log-probability
under ``softmax(logits / T)`` (``T`` = 1 for greedy rows): the quantity a policy-gradient trainer recomputes.

How a batch is generated depends on the device and the model's cache. On CPU, where every layer keeps a plain
full-attention cache (Llama-like models), each prompt is read on its own, in fixed chunks, reusing the states of
recently read prompts that start the same way (the opening that every negotiation's prompt shares, the earlier
turns of the same negotiation); the rows' states are then merged into one left-padded static cache and decoded
together. Reading a prompt is compute-bound, so padding it into a batch only adds work; a decoding step reads the
weights once for all rows. Models with sliding-window or shared key-value layers (Gemma 2-4), and GPUs by default,
take one left-padded transformers ``generate`` call. Stored prompt states belong to the weights that computed them:
an engine serves one set of weights (training builds a new one after every update).

torch and transformers are imported when an engine is built, never at module level.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .hf_decoding import PrefixCache, RowSampler


@dataclass(frozen=True, slots=True)
class Row:
    """One prompt to continue: its token ids, at most ``max_new`` new tokens, the sampling temperature (0: greedy)
    and the seed of the row's own generator (None: unseeded)."""

    ids: Sequence[int]
    max_new: int
    temperature: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.ids:
            raise ValueError("a row needs at least one prompt token")
        if self.max_new < 1 or self.temperature < 0:
            raise ValueError(f"max_new must be >= 1 and temperature >= 0; got {self.max_new}, {self.temperature}")


@dataclass(frozen=True, slots=True)
class Generated:
    """What a row generated: the new ids up to and including the first end-of-text id (or ``max_new`` of them), the
    log-probability of each, and whether it ``stopped`` on an end-of-text id (False: cut off at the cap)."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    stopped: bool


@dataclass
class BatchStats:
    """What the engine did: generate calls and rows served, and the seconds spent reading prompts (prefill, up to
    the first new token) and decoding the rest (for benchmarks and tests)."""

    generate_calls: int = 0
    requests: int = 0
    largest_batch: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prompt_tokens_reused: int = 0
    lone_reads: int = 0
    """Close choices made again on the row's logits read alone (:mod:`nego.agents.token_choice`)."""


@dataclass(frozen=True)
class _Prefilled:
    """One prompt after reading it: its length, each layer's (keys, values), the next token's logits."""

    length: int
    kv: list[tuple[Any, Any]]
    logits: Any


PREFIX_TOKENS_PER_ROW = 1536
"""Tokens of one negotiation's conversation the prompt store keeps room for: a chat template's prompt and most of
an episode. Every live negotiation's conversation must fit, or each turn reads its whole conversation again (the
store evicts the least recently used, and a batch's negotiations take their turns in the same order)."""
MIN_PREFIX_MB, MAX_PREFIX_MB = 256.0, 3072.0


def prefix_budget_mb(model: Any, rows: int) -> float:
    """The prompt store's size for ``rows`` negotiations in flight: their conversations' key-value states at
    :data:`PREFIX_TOKENS_PER_ROW` tokens each, between :data:`MIN_PREFIX_MB` and :data:`MAX_PREFIX_MB`."""
    return min(MAX_PREFIX_MB, max(MIN_PREFIX_MB, rows * PREFIX_TOKENS_PER_ROW * kv_bytes_per_token(model) / 2**20))


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of key-value cache one token takes in every layer of ``model`` (from its config and dtype)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = getattr(config, "num_attention_heads", 1) or 1
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    size = getattr(getattr(model, "dtype", None), "itemsize", 4)
    return int(config.num_hidden_layers * 2 * kv_heads * head_dim * size)


def end_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """Every id that ends a reply: the ids the model's generation config lists, then the tokenizer's EOS."""
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    ids = list(eos) if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return tuple(int(i) for i in ids)


class GenerationEngine:
    """Generates batches of :class:`Row` s with one model. ``eos_ids`` end a row; ``pad_id`` fills left padding.

    ``static_cache`` preallocates the key-value cache of the ``generate`` path (default: on CPU, for models that
    support it); ``split_prefill`` chooses the read-alone, decode-together path (default: on CPU, wherever the
    model's cache allows it; True raises ValueError if it does not); ``prefill_chunk`` is its prompt-reading step and
    ``prefix_cache_mb`` bounds its store of reusable prompt states (0 turns reuse off; None: room for ``rows``
    conversations of :data:`PREFIX_TOKENS_PER_ROW` tokens, see :func:`prefix_budget_mb`). Call :meth:`generate` from
    one thread at a time."""

    def __init__(
        self,
        model: Any,
        *,
        eos_ids: Sequence[int],
        pad_id: int,
        static_cache: bool | None = None,
        split_prefill: bool | None = None,
        prefill_chunk: int = 128,
        prefix_cache_mb: float | None = None,
        rows: int = 32,
    ) -> None:
        if prefix_cache_mb is None:
            prefix_cache_mb = prefix_budget_mb(model, rows)
        if prefill_chunk < 1 or prefix_cache_mb < 0:
            raise ValueError(f"prefill_chunk must be >= 1, prefix_cache_mb >= 0: {prefill_chunk}, {prefix_cache_mb}")
        if not eos_ids:
            raise ValueError("the engine needs at least one end-of-text id")
        self.lm = model
        self.eos_ids = tuple(eos_ids)
        self.pad_id = pad_id
        self.stats = BatchStats()
        if static_cache is None:
            # on CPU, growing the default cache copies all of it every step, which dominates a large batch's decoding;
            # a preallocated one avoids that (on GPUs the copy is cheap and static shapes would trigger compilation)
            static_cache = model.device.type == "cpu" and bool(getattr(model, "_can_compile_fullgraph", False))
        self.static_cache = static_cache
        why_not = why_not_split(model)
        if split_prefill and why_not:
            raise ValueError(f"split_prefill is not possible: {why_not}; leave it unset")
        if split_prefill is None:
            # measured on CPU only, where reading prompts is compute-bound; on a GPU a padded batched prefill may
            # well be the faster one, so GPUs keep the plain generate path unless asked
            split_prefill = not why_not and model.device.type == "cpu"
        self.split_prefill = split_prefill
        self.prefill_chunk = prefill_chunk
        budget = int(prefix_cache_mb * 2**20)
        self.prefixes = PrefixCache(budget) if self.split_prefill and budget > 0 else None

    def forget_prompts(self) -> None:
        """Drop every stored prompt state (the weights they were read with are about to change, or nothing will
        continue these conversations); the store starts empty with the same budget."""
        if self.prefixes is not None:
            self.prefixes = PrefixCache(self.prefixes.budget)

    def generate(self, rows: Sequence[Row]) -> list[Generated]:
        """Generate every row together; results in row order."""
        import torch

        if not rows:
            return []
        sampler = RowSampler(torch, [(r.temperature, r.seed) for r in rows], self.lm.device)
        prompts, limits = [list(r.ids) for r in rows], [r.max_new for r in rows]
        with torch.inference_mode():
            run = self._generate_split if self.split_prefill else self._generate_plain
            tokens, logprobs = run(prompts, limits, sampler)
        self.stats.generate_calls += 1
        self.stats.requests += len(rows)
        self.stats.largest_batch = max(self.stats.largest_batch, len(rows))
        out = []
        for ids, lps, limit in zip(tokens, logprobs, limits, strict=True):
            end = next((k for k, t in enumerate(ids) if t in self.eos_ids), None)
            keep = min(limit, len(ids)) if end is None else end + 1
            out.append(Generated(tuple(ids[:keep]), tuple(lps[:keep]), end is not None))
        return out

    def _generate_plain(
        self, prompts: list[list[int]], limits: list[int], sampler: RowSampler
    ) -> tuple[list[list[int]], list[list[float]]]:
        """One left-padded ``generate`` call for every row: the path for caches that cannot be merged."""
        import torch
        import transformers

        width = max(len(ids) for ids in prompts)
        device = self.lm.device
        input_ids = torch.tensor([[self.pad_id] * (width - len(ids)) + ids for ids in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts], device=device)
        config = transformers.GenerationConfig(
            do_sample=False,
            max_new_tokens=max(limits),
            eos_token_id=list(self.eos_ids),
            pad_token_id=self.pad_id,
            cache_implementation="static" if self.static_cache else None,
            disable_compile=True,  # batch shapes change from call to call: compiling would recompile each time
            **NEUTRAL_PROCESSING,
        )
        sampler.alone = lambda row, ids: self._plain_alone(prompts[row], ids[row, width:].tolist(), limits[row])
        started = time.perf_counter()
        generated = self.lm.generate(
            input_ids=input_ids,
            attention_mask=mask,
            generation_config=config,
            logits_processor=transformers.LogitsProcessorList([sampler]),
        )
        first_logits = sampler.first_call_at or started
        self.stats.prefill_s += first_logits - started
        self.stats.decode_s += time.perf_counter() - first_logits
        steps = torch.stack(sampler.chosen_logprobs, dim=1).tolist() if sampler.chosen_logprobs else [[]] * len(prompts)
        tokens = [generated[row, width:].tolist()[:limit] for row, limit in enumerate(limits)]
        return tokens, [lps[: len(ids)] for lps, ids in zip(steps, tokens, strict=True)]

    def _generate_split(
        self, prompts: list[list[int]], limits: list[int], sampler: RowSampler
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Read each prompt on its own (no padding, the fast causal attention path, a shared prefix reused), then
        decode every row together in one batch over a merged, left-padded, preallocated key-value cache."""
        started = time.perf_counter()
        prefilled = [self._prefill(ids) for ids in prompts]
        self.stats.prefill_s += time.perf_counter() - started
        started = time.perf_counter()
        out = self._decode(prefilled, limits, sampler)
        self.stats.decode_s += time.perf_counter() - started
        return out

    def _plain_alone(self, prompt: list[int], generated: list[int], limit: int) -> Any | None:
        """A row's next-token logits on the ``generate`` path, read alone in one forward pass over its prompt and the
        tokens it generated so far (None once the row is done: its further tokens are dropped)."""
        import torch

        if len(generated) >= limit or any(t in self.eos_ids for t in generated):
            return None
        self.stats.lone_reads += 1
        ids = torch.tensor([[*prompt, *generated]], device=self.lm.device)
        return self.lm(input_ids=ids, use_cache=False).logits[0, -1]

    def _split_alone(self, prompt: _Prefilled, generated: list[int]) -> Any:
        """A row's next-token logits on the split path, read alone: its prompt's own states (read alone, see
        :meth:`_prefill`), then the tokens it generated so far in one pass of their own (a function of the prompt
        and those tokens only)."""
        import torch
        import transformers

        cache = transformers.DynamicCache(config=self.lm.config)
        for layer, (keys, values) in enumerate(prompt.kv):
            cache.update(keys, values, layer)  # the update concatenates: the prompt's states stay as they are
        out = self.lm(
            input_ids=torch.tensor([generated], device=self.lm.device),
            position_ids=torch.arange(prompt.length, prompt.length + len(generated), device=self.lm.device)[None],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[0, -1]

    def _prefill(self, ids: list[int]) -> _Prefilled:
        """The key-value states and the next-token logits of one prompt, read in fixed chunks.

        Chunk boundaries sit at multiples of ``prefill_chunk`` whether or not a cached prefix is reused, so a
        prompt's states are computed by the same operations on the same operands either way, and a reused
        prefix gives bit-identical results to reading the prompt from scratch.
        """
        import torch
        import transformers

        device, step = self.lm.device, self.prefill_chunk
        blocks = self.prefixes.lookup(ids, step) if self.prefixes is not None else []
        reused = len(blocks) * step
        cache = transformers.DynamicCache(config=self.lm.config)
        for layer in range(len(blocks[0]) if blocks else 0):
            keys = torch.cat([block[layer][0] for block in blocks], dim=2)
            cache.update(keys, torch.cat([block[layer][1] for block in blocks], dim=2), layer)
        self.stats.prompt_tokens_reused += reused
        out = None
        for start in range(reused, len(ids), step):
            chunk = ids[start : start + step]
            out = self.lm(
                input_ids=torch.tensor([chunk], device=device),
                position_ids=torch.arange(start, start + len(chunk), device=device)[None],
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        assert out is not None  # a lookup always leaves at least one token to read
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        if self.prefixes is not None:
            self.prefixes.store(ids, kv, step)
        return _Prefilled(len(ids), kv, out.logits[0, -1])

    def _decode(
        self, prefilled: list[_Prefilled], limits: list[int], sampler: RowSampler
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample every row's tokens together: rows sit left-padded in one static cache; a boolean mask hides the
        padding and each row keeps its own positions, so a row attends to exactly what it would alone."""
        import torch
        import transformers

        rows, width, steps = len(prefilled), max(p.length for p in prefilled), max(limits)
        cache = transformers.StaticCache(config=self.lm.config, max_cache_len=width + steps)
        for layer_idx, layer in enumerate(cache.layers):
            keys, values = prefilled[0].kv[layer_idx]
            layer.lazy_initialization(
                keys.new_empty((rows, keys.shape[1], 1, keys.shape[3])),
                values.new_empty((rows, values.shape[1], 1, values.shape[3])),
            )
            for row, p in enumerate(prefilled):
                keys, values = p.kv[layer_idx]
                layer.keys[row, :, width - p.length : width] = keys[0, :, : p.length]
                layer.values[row, :, width - p.length : width] = values[0, :, : p.length]
            layer.cumulative_length.fill_(width)
        device = self.lm.device
        visible = torch.zeros((rows, width + steps), dtype=torch.bool, device=device)
        for row, p in enumerate(prefilled):
            visible[row, width - p.length : width] = True
        positions = torch.tensor([[p.length] for p in prefilled], device=device)
        logits = torch.stack([p.logits for p in prefilled])
        tokens: list[list[int]] = [[] for _ in prefilled]
        logprobs: list[list[float]] = [[] for _ in prefilled]
        open_rows = set(range(rows))

        def alone(row: int) -> Any | None:
            if row not in open_rows:
                return None
            self.stats.lone_reads += 1
            return self._split_alone(prefilled[row], tokens[row])

        for step in range(steps):
            # the first logits are each prompt's own, read alone already
            picked = sampler.pick(logits, alone if step else None)
            chosen = sampler.logprobs(logits, picked)
            for row, (token, lp) in enumerate(zip(picked.tolist(), chosen.tolist(), strict=True)):
                if row in open_rows:
                    tokens[row].append(token)
                    logprobs[row].append(lp)
                    if token in self.eos_ids or len(tokens[row]) >= limits[row]:
                        open_rows.discard(row)
            if not open_rows:
                break
            visible[:, width + step] = True
            logits = self.lm(
                input_ids=picked[:, None],
                position_ids=positions + step,
                attention_mask=visible[:, None, None, :],
                cache=cache,
                use_cache=True,
            ).logits[:, -1]
        return tokens, logprobs


NEUTRAL_PROCESSING: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "min_new_tokens": 0,
    "renormalize_logits": False,
    "remove_invalid_values": False,
}
"""Generation settings stated outright, so that a model's own generation config (which fills every setting left
unset) cannot add a logits processor ahead of the row sampler: tokens are drawn from, and log-probabilities computed
on, the model's logits themselves."""


def why_not_split(model: Any) -> str:
    """Why a batch for ``model`` cannot be read row by row and decoded over one merged cache ('' if it can)."""
    import transformers
    from transformers.cache_utils import DynamicLayer, StaticLayer

    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return "the merged decode passes a boolean attention mask, which only the sdpa attention takes"
    if getattr(config.get_text_config(decoder=True), "num_kv_shared_layers", 0):
        return "some layers share another layer's keys and values"
    wanted = {"cache", "position_ids", "attention_mask", "logits_to_keep"}
    if not wanted <= set(inspect.signature(model.forward).parameters):
        return f"the model's forward does not take all of {sorted(wanted)}"
    static = transformers.StaticCache(config=config, max_cache_len=1).layers
    dynamic = transformers.DynamicCache(config=config).layers
    if any(type(layer) is not StaticLayer for layer in static) or any(type(x) is not DynamicLayer for x in dynamic):
        return "some cache layers are not plain full-attention layers (sliding window, linear attention)"
    return ""
