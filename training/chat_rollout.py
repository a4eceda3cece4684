"""Chat-format rollouts for real (Hugging Face) models: one token sequence per negotiation, built by concatenation.

The first seller turn is the chat template applied to the system and user messages of the negotiator prompt.
Every later turn appends only the ids that the template adds for the new user message (the difference between
rendering a dummy conversation with and without it), so the conversation is never re-tokenised and the ids the
model generated stay exactly as sampled. Replies are the JSON actions ``nego.agents.parsing`` understands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nego.agents.compact import BatchedGenerator, generate_turns
from nego.agents.parsing import parse_text
from nego.agents.prompts import DEFAULT_TEMPLATE, describe_offer, load_template
from nego.agents.trace import TokenTrace
from nego.market.types import Action, ActionKind, NegotiationResult, Observation, Outcome
from nego.scenarios.scenario import Role

from .rollout import MarketRollout


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be extended turn by turn without re-tokenising."""


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
    )
    return list(out["input_ids"] if isinstance(out, dict) else out)


def user_suffix_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids that follow an assistant turn's closing token when a user message ``text`` and the next
    generation prompt are added (requires a prefix-preserving template)."""
    base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    before = _render(tokenizer, base, False)
    after = _render(tokenizer, [*base, {"role": "user", "content": text}], True)
    if after[: len(before)] != before:
        raise TemplateError("the chat template is not prefix-preserving; multi-turn rollouts need one that is")
    stops = [i for i, t in enumerate(before) if t in _stop_ids(tokenizer)]
    if not stops:
        raise TemplateError("the chat template does not close assistant turns with the tokenizer's EOS token")
    return before[stops[-1] + 1 :] + after[len(before) :]


def _stop_ids(tokenizer: Any) -> set[int]:
    eos = tokenizer.eos_token_id
    return set(eos) if isinstance(eos, list) else {eos}


def update_text(obs: Observation, seen: int) -> str:
    """The user message between two own turns: the other side's new moves, feedback, rounds left."""
    lines = []
    for move in obs.history[seen:]:
        if move.role is obs.role:
            continue
        if move.kind is ActionKind.OFFER and move.offer is not None:
            lines.append(f"The {move.role} offers: {describe_offer(move.offer, obs.scenario)}.")
        if move.message:
            lines.append(f'They say: "{move.message}"')
    if obs.feedback:
        lines.append(f"Your last reply was not a valid action: {obs.feedback}")
    lines.append(f"Rounds left including this one: {obs.rounds_left}. Reply with one JSON action.")
    return "\n".join(lines)


@dataclass(slots=True)
class ChatTrace:
    """One side's episode as token ids: the first prompt, then own (mask 1) and environment (mask 0) ids."""

    prompt: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    seen_moves: int = 0

    def add(self, ids: Sequence[int], own: bool, logprobs: Sequence[float] | None = None) -> None:
        self.ids += ids
        self.mask += [int(own)] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    def finish(self, outcome: Outcome, eos_id: int) -> None:
        """End on EOS: the last own turn already does unless it was cut off (then EOS is context, not policy)."""
        if not self.ids or self.ids[-1] != eos_id:
            self.add([eos_id], own=False)


class ChatPolicy:
    """A chat model shared by negotiators; generation is batched (plain transformers, or TRL's vLLM client)."""

    def __init__(self, model: Any, tokenizer: Any, *, max_new: int = 96, vllm: Any = None) -> None:
        self.model, self.tokenizer, self.max_new, self.vllm = model, tokenizer, max_new, vllm
        self.eos_id = (
            tokenizer.eos_token_id if not isinstance(tokenizer.eos_token_id, list) else tokenizer.eos_token_id[0]
        )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.batcher = BatchedGenerator(
            self._vllm_batch
            if vllm is not None
            else (lambda b: generate_turns(model, b, pad_id=pad, stop_id=self.eos_id))
        )

    def _vllm_batch(self, batch: Sequence[Any]) -> list[tuple[list[int], list[float]]]:
        _, completions, logprobs, _ = self.vllm.generate([r.ids for r in batch], None, 1)
        return [(list(c), [float(lp[0]) for lp in lps]) for c, lps in zip(completions, logprobs, strict=True)]


class ChatNegotiator:
    """A seller that speaks JSON actions through a chat template, recording its episode as one id sequence."""

    def __init__(
        self, policy: ChatPolicy, role: Role, seed: int, temperature: float | None, template: str = DEFAULT_TEMPLATE
    ):
        self.policy = policy
        self.role = Role(role)
        self.template = load_template(template)
        self.trace = ChatTrace()
        self.temperature = temperature
        self.generator = None
        if temperature is not None:
            import torch

            self.generator = torch.Generator().manual_seed(int(seed))

    async def act(self, obs: Observation) -> Action:
        tok = self.policy.tokenizer
        if not self.trace.prompt:
            messages = [{"role": m.role, "content": m.content} for m in self.template.render(obs, tools=False)]
            self.trace.prompt = _render(tok, messages, True)
        else:
            self.trace.add(user_suffix_ids(tok, update_text(obs, self.trace.seen_moves)), own=False)
        self.trace.seen_moves = len(obs.history)
        ids, logps = await self.policy.batcher.submit(
            self.trace.prompt + self.trace.ids, self.policy.max_new, self.temperature, self.generator
        )
        self.trace.add(ids, own=True, logprobs=logps)
        if not ids or ids[-1] != self.policy.eos_id:
            self.trace.add([self.policy.eos_id], own=False)  # cut off: close the turn, outside the loss
        text = tok.decode(ids, skip_special_tokens=True)
        return parse_text(text, obs.scenario.issues)

    def record(self, result: NegotiationResult) -> TokenTrace:
        """The finished episode as one id sequence (ending on EOS, outside the loss if the model did not write it)."""
        self.trace.finish(result.outcome, self.policy.eos_id)
        t = self.trace
        return TokenTrace(tuple(t.prompt), tuple(t.ids), tuple(t.mask), tuple(t.logprobs))


@dataclass
class ChatFactory:
    """Negotiators of one chat policy under a learner spec (all share the policy's batched generation)."""

    spec: str
    policy: ChatPolicy
    temperature: float | None = None
    kind: str = "chat-learner"

    def __call__(self, role: Role | str, seed: int) -> ChatNegotiator:
        return ChatNegotiator(self.policy, Role(role), seed, self.temperature)


class ChatMarketRollout(MarketRollout):
    """The market rollout for chat models: same jobs, seeds and rewards, JSON actions in a chat template."""

    def __init__(self, *args: Any, max_new: int = 96, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.max_new = max_new

    def learner(self, model: Any, trainer: Any) -> ChatFactory:
        vllm = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
        policy = ChatPolicy(model, self.tokenizer, max_new=self.max_new, vllm=vllm)
        return ChatFactory(self.spec, policy, float(trainer.temperature))
