"""An in-process transformers backend that batches generation across concurrent negotiations.

Every negotiation that waits on the model puts its request in a queue; one batcher task takes up to
``max_batch`` waiting requests (waiting at most ``window_ms`` for more to arrive), generates for all of them
in a worker thread (so the event loop keeps serving the market meanwhile), and hands each request its own
completion. Sampling draws each row's tokens from that request's own seeded ``torch.Generator``, so a
request's completion does not depend on which other requests shared its batch (up to floating-point
differences from padding, which can only matter at near-exact ties).

How a batch is generated depends on the device and the model's cache. On CPU, where every layer keeps a plain
full-attention cache (Llama-like models), each prompt is read on its own, in fixed chunks, reusing the states
of recently read prompts that start the same way (the opening that every negotiation's prompt shares, the
earlier turns of the same negotiation); the rows' states are then merged into one left-padded static cache and
decoded together. Reading a prompt is compute-bound, so padding it into a batch only adds work; a decoding step
reads the weights once for all rows.
Models with sliding-window or shared key-value layers (Gemma 2-4), and GPUs by default, take one left-padded
``generate`` call.

Checkpoints load with ``AutoModelForCausalLM``; multimodal checkpoints that only map to an image-text-to-text
class (some Gemma sizes) fall back to ``AutoModelForImageTextToText`` and are driven with text only. A directory
holding a LoRA adapter (``adapter_config.json``, as ``nego train --finetune lora`` writes) loads its base model and
folds the adapter into the weights. Replies are plain text (``supports_tools`` is False): the negotiator asks for
a JSON action block in the prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from dataclasses import dataclass, field
from typing import Any

from nego.market.types import Usage

from .base import BackendError, ChatMessage, ChatRequest, ChatResponse
from .hf_decoding import PrefixCache, RowSampler
from .hf_loading import load_checkpoint, torch_dtype

INSTALL_HINT = "the hf backend needs torch and transformers: pip install 'nego[train]'"


def _require_torch_transformers() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from None
    return torch, transformers


@dataclass
class _Pending:
    request: ChatRequest
    future: asyncio.Future[ChatResponse]
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class BatchStats:
    """What the batcher did: generate calls and requests served, and the seconds spent reading prompts
    (prefill, up to the first new token) and decoding the rest (for benchmarks and tests)."""

    generate_calls: int = 0
    requests: int = 0
    largest_batch: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prompt_tokens_reused: int = 0


@dataclass(frozen=True)
class _Prefilled:
    """One prompt after reading it: its length, each layer's (keys, values), the next token's logits."""

    length: int
    kv: list[tuple[Any, Any]]
    logits: Any


class HFBackend:
    """A chat model held in this process. Build it with :meth:`from_spec`; share one instance between every
    negotiator that uses the model, so their requests can be batched together. ``model`` is the name it was
    loaded by, ``lm`` the transformers model itself."""

    kind = "hf"
    supports_tools = False

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        max_batch: int = 32,
        window_ms: float = 5.0,
        static_cache: bool | None = None,
        split_prefill: bool | None = None,
        prefill_chunk: int = 128,
        prefix_cache_mb: float = 256.0,
    ) -> None:
        if max_batch < 1 or window_ms < 0 or prefill_chunk < 1 or prefix_cache_mb < 0:
            raise ValueError(
                "max_batch and prefill_chunk must be >= 1, window_ms and prefix_cache_mb >= 0; got "
                f"{max_batch}, {prefill_chunk}, {window_ms}, {prefix_cache_mb}"
            )
        if not getattr(tokenizer, "chat_template", None):
            raise BackendError(
                f"{name}: the tokenizer has no chat template; use an instruction-tuned (chat) checkpoint "
                "or set tokenizer.chat_template"
            )
        self.lm = model.eval()
        self.tokenizer = tokenizer
        self.model = name
        self.max_batch = max_batch
        self.window_s = window_ms / 1000
        self.stats = BatchStats()
        if static_cache is None:
            # on CPU, growing the default cache copies all of it every step, which dominates a large batch's decoding;
            # a preallocated one avoids that (on GPUs the copy is cheap and static shapes would trigger compilation)
            static_cache = model.device.type == "cpu" and bool(getattr(model, "_can_compile_fullgraph", False))
        self.static_cache = static_cache
        why_not = _why_not_split(model)
        if split_prefill and why_not:
            raise BackendError(f"{name}: split_prefill is not possible: {why_not}; leave it unset")
        if split_prefill is None:
            # measured on CPU only, where reading prompts is compute-bound; on a GPU a padded batched prefill may
            # well be the faster one, so GPUs keep the plain generate path unless asked
            split_prefill = not why_not and model.device.type == "cpu"
        self.split_prefill = split_prefill
        self.prefill_chunk = prefill_chunk
        budget = int(prefix_cache_mb * 2**20)
        self._prefixes = PrefixCache(budget) if self.split_prefill and budget > 0 else None
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        eos_ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
            eos_ids.append(tokenizer.eos_token_id)
        if not eos_ids:
            raise BackendError(f"{name}: neither the tokenizer nor the generation config names an end-of-text token")
        self.eos_ids = tuple(eos_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_spec(
        cls,
        path_or_id: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        max_batch: int = 32,
        window_ms: float = 5.0,
        static_cache: bool | None = None,
        split_prefill: bool | None = None,
        prefill_chunk: int = 128,
        prefix_cache_mb: float = 256.0,
    ) -> HFBackend:
        """Load a tokenizer and model from a local directory or a Hugging Face hub id.

        ``device`` defaults to CUDA when available, else CPU; ``dtype`` ("bfloat16", "float16", "float32",
        "float64") defaults to bfloat16 on a GPU that supports it and float32 otherwise. ``static_cache``
        preallocates the key-value cache of the plain ``generate`` path (default: on CPU, for models that support
        it). ``split_prefill`` chooses the read-alone, decode-together path (default: on CPU, wherever the model's
        cache allows it; True raises if it does not); ``prefill_chunk`` is its prompt-reading step and
        ``prefix_cache_mb`` bounds its store of reusable prompt states (0 turns reuse off). With
        ``HF_HUB_OFFLINE=1`` a hub id loads only from the local cache.
        """
        torch, transformers = _require_torch_transformers()
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = load_checkpoint(transformers, path_or_id, torch_dtype(torch, dtype, device))
        return cls(
            model.to(device),
            tokenizer,
            name=path_or_id,
            max_batch=max_batch,
            window_ms=window_ms,
            static_cache=static_cache,
            split_prefill=split_prefill,
            prefill_chunk=prefill_chunk,
            prefix_cache_mb=prefix_cache_mb,
        )

    # ------------------------------------------------------------------------------------------ serving

    async def complete(self, request: ChatRequest) -> ChatResponse:
        if request.tools:
            raise BackendError("the hf backend answers in text; build the request without tools")
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            # queues and tasks belong to one event loop; a new loop (a new asyncio.run) gets its own batcher
            self._loop, self._queue = loop, asyncio.Queue()
            self._task = loop.create_task(self._batcher(), name=f"hf-batcher:{self.model}")
        pending = _Pending(request, loop.create_future())
        self._queue.put_nowait(pending)
        return await pending.future

    async def aclose(self) -> None:
        if self._task is not None and self._loop is asyncio.get_running_loop():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._queue is not None and not self._queue.empty():
            waiting = self._queue.get_nowait()
            if not waiting.future.done():
                waiting.future.set_exception(BackendError(f"{self.model}: backend closed"))
        self._task = self._queue = self._loop = None

    async def _batcher(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            batch = [await queue.get()]
            deadline = time.perf_counter() + self.window_s
            while len(batch) < self.max_batch:
                if queue.empty():
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        batch.append(await asyncio.wait_for(queue.get(), left))
                    continue
                batch.append(queue.get_nowait())
            live = [p for p in batch if not p.future.done()]
            if not live:
                continue
            try:
                results = await asyncio.to_thread(self._run_batch, [p.request for p in live])
            except Exception as e:  # one failing batch fails its requests, never the batcher
                results = [BackendError(f"{self.model}: generation failed: {type(e).__name__}: {e}")] * len(live)
            now = time.perf_counter()
            for p, result in zip(live, results, strict=True):
                if p.future.done():
                    continue
                if isinstance(result, Exception):
                    p.future.set_exception(result)
                else:
                    text, prompt_n, completion_n = result
                    usage = Usage(prompt_n, completion_n, latency_s=now - p.queued_at, calls=1)
                    p.future.set_result(ChatResponse(text=text, usage=usage))

    # ---------------------------------------------------------------------------------------- generation

    def encode(self, messages: tuple[ChatMessage, ...]) -> list[int]:
        """Token ids of the chat-templated prompt, ending with the assistant's generation prompt."""
        chat = [{"role": m.role, "content": m.content} for m in messages]
        try:
            text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        except Exception as e:
            if not any(m.role == "system" for m in messages):
                raise BackendError(f"{self.model}: the chat template failed: {e}") from None
            # some templates (e.g. older Gemma ones) refuse a system role: fold it into the first user turn
            text = self.tokenizer.apply_chat_template(_fold_system(chat), tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _run_batch(self, requests: list[ChatRequest]) -> list[tuple[str, int, int] | Exception]:
        """Encode, generate for the whole batch, and split the completions (worker thread)."""
        torch, _ = _require_torch_transformers()
        encoded: list[list[int] | Exception] = []
        for r in requests:
            try:
                encoded.append(self.encode(r.messages))
            except Exception as e:
                encoded.append(e if isinstance(e, BackendError) else BackendError(f"{self.model}: {e}"))
        rows = [(i, ids) for i, ids in enumerate(encoded) if not isinstance(ids, Exception)]
        out: list[tuple[str, int, int] | Exception] = list(encoded)  # type: ignore[arg-type]
        if not rows:
            return out
        chosen = [requests[i] for i, _ in rows]
        rows_sampling = [(1.0 if r.temperature is None else r.temperature, r.seed) for r in chosen]
        sampler = RowSampler(torch, rows_sampling, self.lm.device)
        limits = [r.max_tokens for r in chosen]
        with torch.inference_mode():
            if self.split_prefill:
                generated = self._generate_split([ids for _, ids in rows], limits, sampler)
            else:
                generated = self._generate_plain([ids for _, ids in rows], limits, sampler)
        self.stats.generate_calls += 1
        self.stats.requests += len(rows)
        self.stats.largest_batch = max(self.stats.largest_batch, len(rows))
        for (i, ids), tokens in zip(rows, generated, strict=True):
            end = next((k for k, t in enumerate(tokens) if t in self.eos_ids), None)
            completion = tokens if end is None else tokens[:end]
            used = len(tokens) if end is None else end + 1
            out[i] = (self.tokenizer.decode(completion, skip_special_tokens=True), len(ids), used)
        return out

    def _generate_plain(self, prompts: list[list[int]], limits: list[int], sampler: RowSampler) -> list[list[int]]:
        """One left-padded ``generate`` call for every row: the path for caches that cannot be merged."""
        torch, transformers = _require_torch_transformers()
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
        )
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
        return [generated[row, width:].tolist()[:limit] for row, limit in enumerate(limits)]

    def _generate_split(self, prompts: list[list[int]], limits: list[int], sampler: RowSampler) -> list[list[int]]:
        """Read each prompt on its own (no padding, the fast causal attention path, a shared prefix reused), then
        decode every row together in one batch over a merged, left-padded, preallocated key-value cache."""
        started = time.perf_counter()
        prefilled = [self._prefill(ids) for ids in prompts]
        self.stats.prefill_s += time.perf_counter() - started
        started = time.perf_counter()
        tokens = self._decode(prefilled, limits, sampler)
        self.stats.decode_s += time.perf_counter() - started
        return tokens

    def _prefill(self, ids: list[int]) -> _Prefilled:
        """The key-value states and the next-token logits of one prompt, read in fixed chunks.

        Chunk boundaries sit at multiples of ``prefill_chunk`` whether or not a cached prefix is reused, so a
        prompt's states are computed by the same operations on the same operands either way, and a reused
        prefix gives bit-identical results to reading the prompt from scratch.
        """
        torch, transformers = _require_torch_transformers()
        device, step = self.lm.device, self.prefill_chunk
        blocks = self._prefixes.lookup(ids, step) if self._prefixes is not None else []
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
        if self._prefixes is not None:
            self._prefixes.store(ids, kv, step)
        return _Prefilled(len(ids), kv, out.logits[0, -1])

    def _decode(self, prefilled: list[_Prefilled], limits: list[int], sampler: RowSampler) -> list[list[int]]:
        """Sample every row's tokens together: rows sit left-padded in one static cache; a boolean mask hides the
        padding and each row keeps its own positions, so a row attends to exactly what it would alone."""
        torch, transformers = _require_torch_transformers()
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
        open_rows = set(range(rows))
        for step in range(steps):
            picked = sampler.pick(logits)
            for row, token in enumerate(picked.tolist()):
                if row in open_rows:
                    tokens[row].append(token)
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
        return tokens


def _why_not_split(model: Any) -> str:
    """Why a batch for ``model`` cannot be read row by row and decoded over one merged cache ('' if it can)."""
    _, transformers = _require_torch_transformers()
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


def _fold_system(chat: list[dict[str, str]]) -> list[dict[str, str]]:
    system = "\n\n".join(m["content"] for m in chat if m["role"] == "system")
    rest = [dict(m) for m in chat if m["role"] != "system"]
    if rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    else:
        rest.insert(0, {"role": "user", "content": system})
    return rest
