"""An in-process transformers backend that batches generation across concurrent negotiations.

Every negotiation that waits on the model puts its request in a queue; one batcher task takes up to
``max_batch`` waiting requests (waiting at most ``window_ms`` for more to arrive), left-pads them into one
batch, runs one ``generate`` call in a worker thread (so the event loop keeps serving the market meanwhile),
and hands each request its own completion. Sampling draws each row's tokens from that request's own seeded
``torch.Generator``, so a request's completion does not depend on which other requests shared its batch
(up to floating-point differences from padding, which can only matter at near-exact ties).

Checkpoints load with ``AutoModelForCausalLM``; multimodal checkpoints that only map to an image-text-to-text
class (some Gemma sizes) fall back to ``AutoModelForImageTextToText`` and are driven with text only. Replies
are plain text (``supports_tools`` is False): the negotiator asks for a JSON action block in the prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nego.market.types import Usage

from .base import BackendError, ChatMessage, ChatRequest, ChatResponse

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
    ) -> None:
        if max_batch < 1 or window_ms < 0:
            raise ValueError(f"max_batch must be >= 1 and window_ms >= 0, got {max_batch}, {window_ms}")
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
    ) -> HFBackend:
        """Load a tokenizer and model from a local directory or a Hugging Face hub id.

        ``device`` defaults to CUDA when available, else CPU; ``dtype`` ("bfloat16", "float16", "float32",
        "float64") defaults to bfloat16 on a GPU that supports it and float32 otherwise. ``static_cache``
        preallocates the key-value cache (default: on CPU, for models that support it). With
        ``HF_HUB_OFFLINE=1`` a hub id loads only from the local cache.
        """
        torch, transformers = _require_torch_transformers()
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = _dtype(torch, dtype, device)
        source = _source(path_or_id)
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(source)
            model = _load_model(transformers, source, torch_dtype)
        except OSError as e:
            raise BackendError(_load_hint(path_or_id, e)) from None
        return cls(
            model.to(device),
            tokenizer,
            name=path_or_id,
            max_batch=max_batch,
            window_ms=window_ms,
            static_cache=static_cache,
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
        """Encode, left-pad, generate once for the whole batch, and split the completions (worker thread)."""
        torch, transformers = _require_torch_transformers()
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
        width = max(len(ids) for _, ids in rows)
        device = self.lm.device
        input_ids = torch.tensor([[self.pad_id] * (width - len(ids)) + ids for _, ids in rows], device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids in rows], device=device)
        chosen = [requests[i] for i, _ in rows]
        sampler = _RowSampler(torch, [(r.temperature, r.seed) for r in chosen], device)
        config = transformers.GenerationConfig(
            do_sample=False,
            max_new_tokens=max(r.max_tokens for r in chosen),
            eos_token_id=list(self.eos_ids),
            pad_token_id=self.pad_id,
            cache_implementation="static" if self.static_cache else None,
            disable_compile=True,  # batch shapes change from call to call: compiling would recompile each time
        )
        started = time.perf_counter()
        with torch.inference_mode():
            generated = self.lm.generate(
                input_ids=input_ids,
                attention_mask=mask,
                generation_config=config,
                logits_processor=transformers.LogitsProcessorList([sampler]),
            )
        first_logits = sampler.first_call_at or started
        self.stats.prefill_s += first_logits - started
        self.stats.decode_s += time.perf_counter() - first_logits
        self.stats.generate_calls += 1
        self.stats.requests += len(rows)
        self.stats.largest_batch = max(self.stats.largest_batch, len(rows))
        for row, ((i, ids), r) in enumerate(zip(rows, chosen, strict=True)):
            tokens = generated[row, width:].tolist()[: r.max_tokens]
            end = next((k for k, t in enumerate(tokens) if t in self.eos_ids), None)
            completion = tokens if end is None else tokens[:end]
            used = len(tokens) if end is None else end + 1
            out[i] = (self.tokenizer.decode(completion, skip_special_tokens=True), len(ids), used)
        return out


class _RowSampler:
    """A logits processor that samples each row from its own seeded generator (rows with temperature 0 stay
    greedy): the token it picks is the only one left, so the greedy step that follows takes it."""

    def __init__(self, torch: Any, rows: list[tuple[float, int | None]], device: Any) -> None:
        self.torch = torch
        self.first_call_at: float | None = None
        self.temperatures = [t for t, _ in rows]
        self.generators = []
        for t, seed in rows:
            gen = None
            if t > 0:
                gen = torch.Generator(device=device)
                gen.manual_seed(seed if seed is not None else secrets.randbits(63))
            self.generators.append(gen)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.first_call_at is None:
            self.first_call_at = time.perf_counter()
        torch = self.torch
        out = scores.clone()
        for row, (t, gen) in enumerate(zip(self.temperatures, self.generators, strict=True)):
            if gen is None:
                continue
            probs = torch.softmax(scores[row].float() / t, dim=-1)
            token = torch.multinomial(probs, 1, generator=gen)
            out[row].fill_(float("-inf"))
            out[row, token] = 0.0
        return out


def _fold_system(chat: list[dict[str, str]]) -> list[dict[str, str]]:
    system = "\n\n".join(m["content"] for m in chat if m["role"] == "system")
    rest = [dict(m) for m in chat if m["role"] != "system"]
    if rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    else:
        rest.insert(0, {"role": "user", "content": system})
    return rest


def _dtype(torch: Any, dtype: str | None, device: str) -> Any:
    names = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
    if dtype is None:
        gpu_bf16 = device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if gpu_bf16 else torch.float32
    if dtype not in names:
        raise ValueError(f"dtype must be one of {', '.join(names)}; got {dtype!r}")
    return names[dtype]


def _source(path_or_id: str) -> str:
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return str(path)
    looks_local = path_or_id.startswith((".", "/", "~")) or path_or_id.count("/") > 1
    if looks_local and not path.exists():
        raise BackendError(f"no model directory at {path}: pass a directory holding config.json and the weights")
    return path_or_id


def _load_model(transformers: Any, source: str, torch_dtype: Any) -> Any:
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    except ValueError as causal_error:
        # a multimodal checkpoint with no causal-LM mapping: drive its text path through the image-text class
        try:
            return transformers.AutoModelForImageTextToText.from_pretrained(source, dtype=torch_dtype)
        except ValueError:
            raise BackendError(
                f"{source}: not a causal or image-text-to-text language model ({causal_error})"
            ) from None


def _load_hint(path_or_id: str, error: OSError) -> str:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        how = (
            "HF_HUB_OFFLINE is set, so only the local cache is searched: download it first "
            f"(`hf download {path_or_id}`) on a machine with network, or pass a local directory"
        )
    else:
        how = "check the hub id (and HF_TOKEN for gated models) or pass a local directory"
    return f"could not load model {path_or_id!r}: {how}. ({type(error).__name__}: {str(error)[:300]})"
