"""Per-token log-probabilities of a GRPO batch read in length buckets, so the loss costs what its tokens cost.

TRL lays a batch out as one matrix: every prompt left-padded to the longest prompt, every completion right-padded to
the longest completion, the model run over the whole rectangle. Episodes of very different lengths make most of that
rectangle padding. Here each row's attended tokens (one contiguous run: the prompt's, then the completion's) are
taken out of TRL's matrix, the rows are sorted by length and split into buckets (:func:`plan_buckets`), and each
bucket is run right-padded to its own longest row. The per-token results are put back at the columns TRL's layout
gives them, as a ``(rows, completion width)`` matrix, zero where TRL's label is ignored, so everything TRL computes
from them (importance ratio, KL, clipping, the loss normalisation of any ``loss_type``, the metrics) is unchanged.

Why the numbers are the same: a token at column ``c`` of TRL's row attends to the attended columns before it, at
position id ``c`` (the model's default). In a bucket the same token sits at index ``c - start`` and attends to the
same tokens, in the same order, with the same position ids (they are passed explicitly); the padding after a row's
last token is masked as TRL's is, and causal attention never reaches it anyway. Only the shapes of the matrix
products differ, so results agree to float rounding, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

Forward = Callable[
    ["torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor"], tuple["torch.Tensor", "torch.Tensor | None"]
]
"""``(input_ids, attention_mask, position_ids, labels) -> (log_probs, entropy or None)``: the model's fused LM head
on one bucket, per-token results of shape ``(rows, width - 1)`` for the next-token labels."""

BUCKET_CALL_TOKENS = 96
"""What one more model call costs, counted in tokens of a bucket (padding included). For the tiny model's forward and
backward at one torch thread, fits of time against shape put a call's fixed cost at 57 tokens (linear in tokens) to
170 (with the attention's quadratic term); on the episode lengths of real steps the loss was fastest with 64 to 128,
and changes little between 32 and 256 (the DP then makes 5 to 12 buckets of 64 rows)."""


@dataclass(frozen=True, slots=True)
class Spans:
    """Where each row's attended tokens lie in TRL's matrix: columns ``start[i]`` to ``end[i]`` (exclusive)."""

    start: torch.Tensor
    end: torch.Tensor


def row_spans(attention_mask: torch.Tensor, prompt_width: int) -> Spans | None:
    """Each row's run of attended columns, or None when a row's attended columns are not one run, or a row has no
    attended prompt token (then its first completion token would be read after padding, which only TRL's own layout
    reproduces)."""
    import torch

    if prompt_width < 1:
        return None
    mask = attention_mask.bool()
    length = mask.sum(dim=1)
    start = mask.int().argmax(dim=1)
    columns = torch.arange(mask.size(1), device=mask.device)
    run = (columns >= start[:, None]) & (columns < (start + length)[:, None])
    if not torch.equal(run, mask) or not bool(mask[:, prompt_width - 1].all()):
        return None
    return Spans(start, start + length)


def plan_buckets(lengths: Sequence[int], *, max_rows: int, call_tokens: int = BUCKET_CALL_TOKENS) -> list[list[int]]:
    """Row indices in buckets: rows sorted by length (ties by index), cut where the total cost, ``rows x longest``
    over the buckets plus ``call_tokens`` per bucket, is least; no bucket holds more than ``max_rows`` rows."""
    if max_rows < 1:
        raise ValueError("max_rows must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n = len(order)
    best = [0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        for i in range(max(0, j - max_rows), j):
            cost = best[i] + (j - i) * longest + call_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    buckets = []
    j = n
    while j > 0:
        buckets.append(order[cut[j] : j])
        j = cut[j]
    return buckets[::-1]


def split_buckets(buckets: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """``buckets`` cut further into ``count``: the bucket with the most rows (the first of them) is halved, its
    shorter rows in the first half, until there are ``count``; fewer rows than ``count`` is an error."""
    out = [list(b) for b in buckets]
    if count > sum(map(len, out)):
        raise ValueError(f"cannot split {sum(map(len, out))} rows into {count} buckets")
    while len(out) < count:
        k = max(range(len(out)), key=lambda i: (len(out[i]), -i))
        half = len(out[k]) // 2
        out[k : k + 1] = [out[k][:half], out[k][half:]]
    return out


@dataclass(frozen=True, slots=True)
class BucketPlan:
    """A batch's rows in buckets, and where each row's attended tokens lie in TRL's matrix."""

    spans: Spans
    buckets: list[list[int]]


def plan_batch(
    attention_mask: torch.Tensor, logits_to_keep: int, *, max_rows: int, call_tokens: int = BUCKET_CALL_TOKENS
) -> BucketPlan | None:
    """The buckets of TRL's batch (:func:`plan_buckets` over the rows' attended lengths), or None when the batch is
    not laid out as :func:`row_spans` needs (the caller reads it TRL's way)."""
    spans = row_spans(attention_mask, attention_mask.size(1) - logits_to_keep)
    if spans is None:
        return None
    lengths = (spans.end - spans.start).tolist()
    return BucketPlan(spans, plan_buckets(lengths, max_rows=max_rows, call_tokens=call_tokens))


def agreed(plan: BucketPlan | None, counts: Callable[[int], Sequence[int]]) -> BucketPlan | None:
    """The plan of one of several processes that shard a model (FSDP, DeepSpeed ZeRO-3): each model call gathers the
    weights from all of them, so all must make the same number of calls. ``counts(mine)`` hands every process's
    bucket count (0: reads TRL's way) to all of them; if any reads TRL's way, all do (None), otherwise each cuts its
    buckets into the largest count (:func:`split_buckets`; the processes hold the same number of rows)."""
    everyone = counts(0 if plan is None else len(plan.buckets))
    if plan is None or min(everyone) == 0:
        return None
    return BucketPlan(plan.spans, split_buckets(plan.buckets, max(everyone)))


def read_buckets(
    forward: Forward, input_ids: torch.Tensor, plan: BucketPlan, logits_to_keep: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The completion tokens' log-probabilities (and entropies, if ``forward`` gives them) of TRL's batch
    ``input_ids``, read bucket by bucket: ``(rows, logits_to_keep)`` each, as TRL's own forward returns them."""
    import torch

    device = input_ids.device
    prompt_width = input_ids.size(1) - logits_to_keep
    lengths = (plan.spans.end - plan.spans.start).tolist()
    completion_columns = prompt_width + torch.arange(logits_to_keep, device=device)
    logps, entropies = [], []
    for rows in plan.buckets:
        index = torch.tensor(rows, device=device)
        start, end = plan.spans.start[index], plan.spans.end[index]
        width = max(2, max(lengths[i] for i in rows))  # at least one next-token label, so the model always runs
        offsets = torch.arange(width, device=device)
        columns = (start[:, None] + offsets).clamp(max=input_ids.size(1) - 1)
        attended = offsets < (end - start)[:, None]
        ids = input_ids[index].gather(1, columns)
        labels = ids.masked_fill(~(attended & (columns >= prompt_width)), -100)
        log_probs, entropy = forward(ids, attended.long(), columns, labels)
        # TRL's completion column c is bucket index c - start; its label is predicted at index c - start - 1
        at = (completion_columns[None, :] - start[:, None] - 1).clamp(0, width - 2)
        kept = completion_columns[None, :] < end[:, None]
        logps.append(torch.where(kept, log_probs.gather(1, at), 0.0))
        if entropy is not None:
            entropies.append(torch.where(kept, entropy.gather(1, at), 0.0))
    back = torch.empty(len(lengths), dtype=torch.long, device=device)
    order = torch.tensor([i for rows in plan.buckets for i in rows], device=device)
    back[order] = torch.arange(len(lengths), device=device)
    return torch.cat(logps)[back], (torch.cat(entropies)[back] if entropies else None)
