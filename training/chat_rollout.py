"""Chat-format rollouts for real (Hugging Face) models: one token sequence per negotiation, laid out exactly as the
model is played.

A learning seller is an :class:`~nego.agents.llm.negotiator.LLMNegotiator` (the negotiator that plays a registered chat
model) with a conversation template (:data:`~nego.agents.llm.chat_layout.CHAT_TEMPLATE`) whose backend, a
:class:`TraceBackend` of its own, records the episode's tokens while it generates through the policy's shared generator:
the in-process engine (:class:`~nego.agents.llm.backends.hf.HFBackend` around the model being trained) or TRL's vLLM
(:class:`~nego.training.vllm_turns.VLLMTurns`).

Every turn the negotiator sends the whole conversation so far; the trace backend renders it with the model's chat
template (:func:`~nego.agents.llm.backends.hf.chat_ids`, as the in-process backend does when serving) and checks that
the rendering extends the sequence recorded so far (the template must be prefix-preserving). The ids the rendering adds
after the last prompt begin with the model's previous reply as the template writes it: as long as they equal the
ids the model sampled, those are trained (loss mask 1, with their sampling log-probabilities); from the first
difference on (a reply the tokenizer would encode differently, a template that trims replies, a stop id other than
the template's) the rendered ids are context (mask 0), as is everything after the reply. A reply the layout withholds
(an invalid one, under ``invalid_replies = withheld`` or ``last_move``) is not in the sequence at all: its ids are not
trained, and what the layout writes in its place (an empty assistant message, or the last legal reply) is context. So
the training sequence at every turn *is* the prompt the model receives when it is played, and every trained id was
sampled in exactly the context it is trained in.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from nego.agents.llm.backends.base import ChatMessage, ChatRequest, ChatResponse
from nego.agents.llm.backends.hf import chat_ids, reply_text
from nego.agents.llm.backends.hf_engine import Generated, end_ids
from nego.agents.llm.chat_layout import CHAT_TEMPLATE
from nego.agents.llm.negotiator import LLMNegotiator
from nego.agents.llm.prompts import load_template
from nego.agents.trace import TokenTrace
from nego.market.types import NegotiationResult, Usage
from nego.scenarios.scenario import Role

from .free_memory import release_freed_memory

log = logging.getLogger(__name__)

DEFAULT_TURN_TOKENS = 96
DEFAULT_GENERATION_ROWS = 1024
"""Rows one in-process generate call reads when no memory plan says otherwise (a real model's preflight does)."""


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be extended turn by turn without re-tokenising."""


class TokenGenerator(Protocol):
    """Continues token ids: the in-process backend or TRL's vLLM, shared by every negotiator of a policy."""

    async def generate(self, ids: Sequence[int], max_new: int, temperature: float, seed: int | None) -> Generated: ...

    async def aclose(self) -> None: ...


def user_suffix_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids that follow an assistant turn's closing token when a user message ``text`` and the next generation
    prompt are added; raises :class:`TemplateError` unless the template is prefix-preserving and closes assistant
    turns with an end-of-text id (the check a chat model passes before training)."""
    base = (ChatMessage("user", "u"), ChatMessage("assistant", "a"))
    before = chat_ids(tokenizer, base, generation_prompt=False)
    after = chat_ids(tokenizer, (*base, ChatMessage("user", text)))
    if after[: len(before)] != before:
        raise TemplateError("the chat template is not prefix-preserving; multi-turn rollouts need one that is")
    eos = tokenizer.eos_token_id
    stops = [i for i, t in enumerate(before) if t in (set(eos) if isinstance(eos, list) else {eos})]
    if not stops:
        raise TemplateError("the chat template does not close assistant turns with the tokenizer's EOS token")
    return before[stops[-1] + 1 :] + after[len(before) :]


@dataclass(slots=True)
class ChatTrace:
    """One side's episode as token ids: the first prompt, then every later id with its loss mask and log-probability,
    and the reply generated last (placed once the next rendering shows how the template writes it)."""

    prompt: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    pending: Generated | None = None
    sampled: int = 0
    """Ids the model generated so far."""
    context_only: int = 0
    """Generated ids kept out of the loss because the rendering of the conversation writes them differently."""
    withheld: int = 0
    """Generated ids of replies the layout withholds (invalid moves): in no sequence, so never trained."""

    def extend(self, rendered: list[int], *, withheld: bool = False) -> None:
        """Take the rendering of the whole conversation, up to the next generation prompt, as the sequence so far;
        ``withheld``: the layout withheld the previous reply (an invalid one) and wrote something else in its place."""
        if not self.prompt:
            self.prompt = list(rendered)
            return
        known = len(self.prompt) + len(self.ids)
        if rendered[: len(self.prompt)] != self.prompt or rendered[len(self.prompt) : known] != self.ids:
            raise TemplateError(
                "the chat template rendered an earlier part of the conversation differently once a turn was added; "
                "multi-turn rollouts need a prefix-preserving template"
            )
        tail = rendered[known:]
        own = self._take_pending()
        same = 0
        for a, b in zip(() if withheld else own.ids, tail, strict=False):
            if a != b:
                break
            same += 1
        if withheld:
            self.withheld += len(own.ids)
        else:
            self.context_only += len(own.ids) - same
        self.ids += tail
        self.mask += [1] * same + [0] * (len(tail) - same)
        self.logprobs += list(own.logprobs[:same]) + [0.0] * (len(tail) - same)

    def generated(self, out: Generated) -> None:
        self.pending = out
        self.sampled += len(out.ids)

    def close(self, eos_ids: Sequence[int], closing_id: int) -> TokenTrace:
        """The episode: the last reply as generated (mask 1), ending on an end-of-text id (``closing_id`` added as
        context when the model did not write one)."""
        if self.pending is not None:
            own = self._take_pending()
            self.ids += own.ids
            self.mask += [1] * len(own.ids)
            self.logprobs += own.logprobs
        if self.prompt and (not self.ids or self.ids[-1] not in eos_ids):
            self.ids.append(closing_id)
            self.mask.append(0)
            self.logprobs.append(0.0)
        return TokenTrace(tuple(self.prompt), tuple(self.ids), tuple(self.mask), tuple(self.logprobs))

    def _take_pending(self) -> Generated:
        own, self.pending = self.pending, None
        return own if own is not None else Generated((), (), False)


class ChatPolicy:
    """A chat model shared by negotiators: its tokenizer, the conversation template, the per-turn cap (``max_new``)
    and the generator every negotiator's turns go through: in process (at most ``max_rows`` rows per generate call,
    the preflight's memory plan), TRL's vLLM given ``vllm`` (kept in step with the other training processes by
    ``lockstep``), or any other ``generator``."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new: int = DEFAULT_TURN_TOKENS,
        vllm: Any = None,
        lockstep: Any = None,
        template: str = CHAT_TEMPLATE,
        generator: TokenGenerator | None = None,
        max_rows: int = DEFAULT_GENERATION_ROWS,
    ) -> None:
        if max_new < 1:
            raise ValueError(f"max_new (the cap on one turn's new tokens) must be >= 1, got {max_new}")
        self.tokenizer = tokenizer
        self.max_new = max_new
        self.template = load_template(template)
        if not self.template.conversational:
            raise TemplateError(f"template {template!r} has no [update] section; chat training needs a conversation")
        self.eos_ids = end_ids(model, tokenizer)
        self.closing_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else self.eos_ids[0]
        self.generator: TokenGenerator
        if generator is not None:
            self.generator = generator
        elif vllm is not None:
            from .vllm_turns import VLLMTurns

            self.generator = VLLMTurns(vllm, max_new=max_new, eos_ids=self.eos_ids, lockstep=lockstep)
        else:
            from nego.agents.llm.backends.hf import HFBackend

            # built for this policy version: the prompt states it stores belong to these weights
            self.generator = HFBackend(model, tokenizer, name="policy", max_batch=max_rows)
        self.traces: list[ChatTrace] = []

    @property
    def context_only_share(self) -> float:
        """Of the ids generated so far, the share kept out of the loss (the template writes them differently)."""
        sampled = sum(t.sampled for t in self.traces)
        return sum(t.context_only for t in self.traces) / sampled if sampled else 0.0

    def forget_prompts(self) -> None:
        """Free the prompt states the in-process generator stores (a finished batch's: the next batch has new
        weights and builds its own policy)."""
        forget = getattr(self.generator, "forget_prompts", None)
        if forget is not None:
            forget()

    def drain(self) -> int:
        """With several training processes on a vLLM server: join the others' calls until all are done."""
        drain = getattr(self.generator, "drain", None)
        return drain() if drain is not None else 0

    async def aclose(self) -> None:
        await self.generator.aclose()


class TraceBackend:
    """A chat backend for one learning negotiator: renders each request's messages with the model's chat template,
    records the episode's ids (see :class:`ChatTrace`) and generates through the policy's shared generator."""

    kind = "chat-learner"
    supports_tools = False

    def __init__(self, policy: ChatPolicy) -> None:
        self.policy = policy
        self.model = "policy"
        self.trace = ChatTrace()
        self.last_reply = ""
        """The text of the reply generated last: a conversation that writes another there withheld it."""
        policy.traces.append(self.trace)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        policy = self.policy
        ids = chat_ids(policy.tokenizer, request.messages)
        previous = request.messages[-2] if len(request.messages) > 2 else None
        withheld = policy.template.withhold_invalid and previous is not None and previous.content != self.last_reply
        self.trace.extend(ids, withheld=withheld)
        temperature = 1.0 if request.temperature is None else request.temperature
        out = await policy.generator.generate(ids, request.max_tokens, temperature, request.seed)
        self.trace.generated(out)
        text = self.last_reply = reply_text(policy.tokenizer, out, policy.eos_ids)
        return ChatResponse(text, usage=Usage(len(ids), len(out.ids), calls=1), truncated=not out.stopped)

    async def aclose(self) -> None:
        pass


class ChatNegotiator(LLMNegotiator):
    """A learning seller: the negotiator a registered chat model is played by (conversation template, JSON replies,
    a per-call sampling seed), recording its episode as one id sequence for GRPO."""

    def __init__(self, policy: ChatPolicy, role: Role, seed: int, temperature: float | None) -> None:
        self.tracer = TraceBackend(policy)
        super().__init__(
            self.tracer,
            role=role,
            seed=seed,
            template=policy.template,
            max_tokens=policy.max_new,
            temperature=temperature,
            use_tools=False,
        )

    def record(self, result: NegotiationResult) -> TokenTrace:
        """The finished episode as one id sequence (ending on an end-of-text id, outside the loss if the model did
        not write it)."""
        policy = self.tracer.policy
        return self.tracer.trace.close(policy.eos_ids, policy.closing_id)


@dataclass
class ChatFactory:
    """Negotiators of one chat policy under a learner spec (all share the policy's batched generation)."""

    spec: str
    policy: ChatPolicy
    temperature: float | None = None
    kind: str = "chat-learner"

    def __call__(self, role: Role | str, seed: int) -> ChatNegotiator:
        return ChatNegotiator(self.policy, Role(role), seed, self.temperature)

    def forget_prompts(self) -> None:
        self.policy.forget_prompts()

    async def aclose(self) -> None:
        await self.policy.aclose()


def layout_config(template: str, max_new: int) -> dict[str, Any]:
    """What the model registry records about how a chat model was trained, so it is played the same way: the
    conversation template (name and id) and the cap on one turn's new tokens."""
    return {"template": template, "template_id": load_template(template).id, "turn_tokens": max_new}


class ChatRollout:
    """A chat policy in a market rollout: the conversation layout and JSON actions, each turn capped at ``max_new``
    new tokens (the episode cap is the rollout's ``max_tokens``), at most ``max_rows`` rows per in-process generate
    call, or TRL's vLLM when the trainer uses it."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_new: int = DEFAULT_TURN_TOKENS,
        max_rows: int = DEFAULT_GENERATION_ROWS,
        template: str = CHAT_TEMPLATE,
    ):
        if max_rows < 1:
            raise ValueError(f"max_rows (rows per generate call) must be >= 1, got {max_rows}")
        self.tokenizer = tokenizer
        self.template = template
        self.max_new, self.max_rows = max_new, max_rows
        self.last: ChatPolicy | None = None
        """The policy of the latest batch."""
        self._open: ChatPolicy | None = None
        self._warned = False

    def factory(self, spec: str, model: Any, trainer: Any) -> ChatFactory:
        vllm = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
        lockstep = None
        if vllm is not None and _needs_lockstep(vllm, trainer):
            from accelerate.utils import gather_object

            from .vllm_turns import Lockstep

            filler = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else 0
            lockstep = Lockstep(gather_object, [filler])
        self.last = self._open = ChatPolicy(
            model,
            self.tokenizer,
            max_new=self.max_new,
            vllm=vllm,
            lockstep=lockstep,
            max_rows=self.max_rows,
            template=self.template,
        )
        return ChatFactory(spec, self.last, float(trainer.temperature))

    def finish(self) -> None:
        """After a batch: join the other processes' generation calls until theirs have ended too (so that none
        waits forever on this one), and say once if the template kept many generated tokens out of the loss."""
        policy, self._open = self._open, None
        if policy is None:
            return
        policy.drain()
        policy.forget_prompts()  # before the training step, which would otherwise run beside them
        release_freed_memory()
        share = policy.context_only_share
        if share > 0.05 and not self._warned:
            self._warned = True
            log.warning(
                "%.0f%% of the generated tokens were kept out of the loss: the chat template does not write "
                "the model's replies back as it generated them (trimmed, or encoded differently); said once",
                100 * share,
            )


def _needs_lockstep(vllm: Any, trainer: Any) -> bool:
    """Whether TRL's vLLM generation calls are collectives: server mode with several processes, or a colocated
    engine sharded over several (tensor-parallel) processes."""
    processes = int(getattr(trainer.accelerator, "num_processes", 1))
    sharded = int(getattr(vllm, "tensor_parallel_size", 1)) > 1
    return processes > 1 and (getattr(vllm, "mode", "colocate") == "server" or sharded)
