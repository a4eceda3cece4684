"""An in-process transformers backend: chat requests from concurrent negotiations batched through one model.

Every negotiation that waits on the model puts its request in a queue; the batcher takes up to ``max_batch``
waiting requests (waiting at most ``window_ms`` for more to arrive) and generates for all of them in a worker
thread (so the event loop keeps serving the market meanwhile) through the model's
:class:`~nego.agents.llm.backends.hf_engine.GenerationEngine`, which chooses how a batch is generated and keeps
each request's sampling independent of its batch mates (each request's ``seed`` seeds its own generator).

A request's messages become token ids through :func:`chat_ids` (the model's chat template, rendered and then
tokenised), and a completion becomes text through :func:`reply_text`; training a chat model
(``nego.training.chat_rollout``) uses the same two functions and the same engine, so a trained model is played on
exactly the token sequences it was trained on. :meth:`HFBackend.generate` serves token ids directly, through the same
queue and engine.

Checkpoints load with ``AutoModelForCausalLM``; multimodal checkpoints that only map to an image-text-to-text
class (some Gemma sizes) fall back to ``AutoModelForImageTextToText`` and are driven with text only. A directory
holding a LoRA adapter (``adapter_config.json``, as ``nego train --finetune lora`` writes) loads its base model and
folds the adapter into the weights. Replies are plain text (``supports_tools`` is False): the negotiator asks for
a JSON action block in the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nego.agents.batching import Batcher
from nego.market.types import Usage

from .base import BackendError, ChatMessage, ChatRequest, ChatResponse
from .hf_engine import BatchStats, Generated, GenerationEngine, Row, end_ids
from .hf_loading import load_checkpoint, torch_dtype

INSTALL_HINT = "the hf backend needs torch and transformers: pip install 'nego[train]'"


def _require_torch_transformers() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from None
    return torch, transformers


def chat_ids(tokenizer: Any, messages: Sequence[ChatMessage], *, generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template (ending with the assistant's generation prompt
    unless told otherwise): the text the template renders, tokenised without added special tokens. A template that
    refuses a system role gets the system text at the start of the first user turn."""
    chat = [{"role": m.role, "content": m.content} for m in messages]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as e:
        if not any(m.role == "system" for m in messages):
            raise BackendError(f"the chat template failed: {e}") from None
        # some templates (e.g. older Gemma ones) refuse a system role: fold it into the first user turn
        folded = _fold_system(chat)
        text = tokenizer.apply_chat_template(folded, tokenize=False, add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def reply_text(tokenizer: Any, generated: Generated, eos_ids: Sequence[int]) -> str:
    """The text of a completion: its ids before the end-of-text id, decoded without special tokens (what a server
    sends back as the reply, and what the next turn's conversation holds)."""
    ids = generated.ids[:-1] if generated.stopped and generated.ids and generated.ids[-1] in eos_ids else generated.ids
    return tokenizer.decode(list(ids), skip_special_tokens=True)


@dataclass(frozen=True, slots=True)
class _Ask:
    """One queued request: chat messages (tokenised in the worker thread) or token ids, and how to sample."""

    prompt: tuple[ChatMessage, ...] | tuple[int, ...]
    max_new: int
    temperature: float
    seed: int | None


class HFBackend:
    """A chat model held in this process. Build it with :meth:`from_spec` (or around a model already loaded, as
    training does); share one instance between every negotiator that uses the model, so their requests can be batched
    together. ``model`` is the name it was loaded by, ``lm`` the transformers model itself. The engine's options
    (``static_cache``, ``split_prefill``, ``prefill_chunk``, ``prefix_cache_mb``) are described in
    :class:`~nego.agents.llm.backends.hf_engine.GenerationEngine`."""

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
        prefix_cache_mb: float | None = None,
    ) -> None:
        if max_batch < 1 or window_ms < 0 or prefill_chunk < 1 or (prefix_cache_mb or 0) < 0:
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
        self.eos_ids = end_ids(model, tokenizer)
        if not self.eos_ids:
            raise BackendError(f"{name}: neither the tokenizer nor the generation config names an end-of-text token")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        try:
            self.engine = GenerationEngine(
                model,
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
                static_cache=static_cache,
                split_prefill=split_prefill,
                prefill_chunk=prefill_chunk,
                prefix_cache_mb=prefix_cache_mb,
                rows=max_batch,
            )
        except ValueError as e:
            raise BackendError(f"{name}: {e}") from None
        self._batcher: Batcher[_Ask, tuple[Generated, int] | BackendError] = Batcher(
            self._run_batch,
            max_batch=max_batch,
            window_s=window_ms / 1000,
            failure=lambda e: BackendError(f"{self.model}: generation failed: {type(e).__name__}: {e}"),
            name=f"hf-batcher:{name}",
        )

    @property
    def stats(self) -> BatchStats:
        return self.engine.stats

    def forget_prompts(self) -> None:
        """Drop the engine's stored prompt states (see :meth:`GenerationEngine.forget_prompts`)."""
        self.engine.forget_prompts()

    @property
    def split_prefill(self) -> bool:
        return self.engine.split_prefill

    @property
    def static_cache(self) -> bool:
        return self.engine.static_cache

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
        prefix_cache_mb: float | None = None,
    ) -> HFBackend:
        """Load a tokenizer and model from a local directory or a Hugging Face hub id.

        ``device`` defaults to CUDA when available, else CPU; ``dtype`` ("bfloat16", "float16", "float32",
        "float64") defaults to bfloat16 on a GPU that supports it and float32 otherwise. With ``HF_HUB_OFFLINE=1``
        a hub id loads only from the local cache.
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
        temperature = 1.0 if request.temperature is None else request.temperature
        ask = _Ask(tuple(request.messages), request.max_tokens, temperature, request.seed)
        (generated, prompt_n), waited = await self._submit(ask)
        usage = Usage(prompt_n, len(generated.ids), latency_s=waited, calls=1)
        text = reply_text(self.tokenizer, generated, self.eos_ids)
        return ChatResponse(text=text, usage=usage, truncated=not generated.stopped)

    async def generate(self, ids: Sequence[int], max_new: int, temperature: float, seed: int | None) -> Generated:
        """Continue the token ids ``ids`` (a chat-templated conversation) by at most ``max_new`` tokens, batched with
        every other waiting request; the ids come back with their sampling log-probabilities."""
        (generated, _), _ = await self._submit(_Ask(tuple(ids), max_new, temperature, seed))
        return generated

    async def _submit(self, ask: _Ask) -> tuple[tuple[Generated, int], float]:
        result, waited = await self._batcher.submit(ask)
        if isinstance(result, BaseException):  # the batcher sets exceptions on the future; this is for type checkers
            raise result
        return result, waited

    def encode(self, messages: tuple[ChatMessage, ...]) -> list[int]:
        """Token ids of the chat-templated prompt, ending with the assistant's generation prompt."""
        try:
            return chat_ids(self.tokenizer, messages)
        except BackendError as e:
            raise BackendError(f"{self.model}: {e}") from None

    async def aclose(self) -> None:
        await self._batcher.aclose(BackendError(f"{self.model}: backend closed"))

    def _run_batch(self, asks: list[_Ask]) -> list[tuple[Generated, int] | BackendError]:
        """Tokenise the chat requests, then generate for the whole batch (worker thread)."""
        out: list[tuple[Generated, int] | BackendError] = []
        rows: list[tuple[int, Row]] = []
        for i, ask in enumerate(asks):
            try:
                ids = self.encode(ask.prompt) if ask.prompt and isinstance(ask.prompt[0], ChatMessage) else ask.prompt
                rows.append((i, Row(ids, ask.max_new, ask.temperature, ask.seed)))
                out.append(BackendError(f"{self.model}: not generated"))
            except (BackendError, ValueError) as e:
                out.append(e if isinstance(e, BackendError) else BackendError(f"{self.model}: {e}"))
        for (i, row), generated in zip(rows, self.engine.generate([row for _, row in rows]), strict=True):
            out[i] = (generated, len(row.ids))
        return out


def _fold_system(chat: list[dict[str, str]]) -> list[dict[str, str]]:
    system = "\n\n".join(m["content"] for m in chat if m["role"] == "system")
    rest = [dict(m) for m in chat if m["role"] != "system"]
    if rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    else:
        rest.insert(0, {"role": "user", "content": system})
    return rest
