"""The log-probabilities a GRPO trainer recomputes for recorded episodes, to check the ones recorded at sampling
against: TRL's way (one padded batch) and the plainest one (each sequence alone)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def trainer_logprobs(model: Any, traces: Sequence[Any], temperature: float, pad_id: int) -> list[list[float]]:
    """Per-token log-probabilities of each trace's completion as TRL's GRPO trainer computes them: one batch, prompts
    left-padded and completions right-padded, ``logits[:, :-1]`` of the completion span over the temperature, then a
    log-softmax gathered at the completion ids."""
    import torch
    from trl.trainer.utils import selective_log_softmax

    p_len = max(len(t.prompt_ids) for t in traces)
    c_len = max(len(t.completion_ids) for t in traces)
    ids = torch.full((len(traces), p_len + c_len), pad_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for row, t in enumerate(traces):
        span = slice(p_len - len(t.prompt_ids), p_len + len(t.completion_ids))
        ids[row, span] = torch.tensor([*t.prompt_ids, *t.completion_ids])
        att[row, span] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att, logits_to_keep=c_len + 1).logits[:, :-1]
        logps = selective_log_softmax(logits.float() / temperature, ids[:, p_len:])
    return [logps[row, : len(t.completion_ids)].tolist() for row, t in enumerate(traces)]


def lone_logprobs(model: Any, trace: Any, temperature: float) -> list[float]:
    """The same for one trace read alone: its whole sequence in one unpadded forward pass."""
    import torch

    seq = [*trace.prompt_ids, *trace.completion_ids]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq])).logits[0, len(trace.prompt_ids) - 1 : -1].float()
        logps = torch.log_softmax(logits / temperature, dim=-1)
    return logps.gather(1, torch.tensor(trace.completion_ids)[:, None])[:, 0].tolist()


def largest_gap(traces: Sequence[Any], recomputed: Sequence[Sequence[float]]) -> tuple[float, int]:
    """The largest |recorded - recomputed| over the trained ids, and how many trained ids there are; an id outside
    the loss must have been recorded as 0."""
    gap, trained = 0.0, 0
    for trace, again in zip(traces, recomputed, strict=True):
        for m, recorded, lp in zip(trace.mask, trace.logprobs, again, strict=True):
            if m:
                trained += 1
                gap = max(gap, abs(recorded - lp))
            elif recorded != 0.0:
                raise AssertionError(f"an id outside the loss has log-probability {recorded}")
    return gap, trained
