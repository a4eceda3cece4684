"""Warm start by behaviour cloning: rule-based sellers play the market, their moves are recorded in the
compact protocol, and the tiny model learns to predict the seller's words (buyer words are context only).

A mixture of sellers (different concession speeds) gives the cloned policy spread, so GRPO groups later
see different rewards instead of identical ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from nego.agents.compact.protocol import CompactTrace, action_words, parse_action
from nego.agents.registry import resolve
from nego.market.marketplace import Job
from nego.market.protocol import Negotiator
from nego.market.types import Action, NegotiationResult, Observation
from nego.scenarios.scenario import Role, Scenario

from .pool import BuyerPool
from .runner import EpisodeRunner

if TYPE_CHECKING:
    from nego.market.transcripts import TranscriptWriter


class RecordingSeller:
    """Wraps a rule-based seller: plays its move as the compact protocol would express it, and records it."""

    def __init__(self, inner: Negotiator) -> None:
        self.inner = inner
        self.trace = CompactTrace(Role.SELLER)

    async def act(self, obs: Observation) -> Action:
        self.trace.observe(obs)
        words = action_words(obs.scenario, await self.inner.act(obs))
        self.trace.add(words, own=True)
        return parse_action(obs.scenario, words)

    def record(self, result: NegotiationResult) -> CompactTrace:
        self.trace.finish(result.outcome)
        return self.trace


@dataclass(frozen=True, slots=True)
class RecordingFactory:
    """A rule-based spec whose sellers are recorded in the compact protocol (its buyers play unchanged)."""

    spec: str
    kind: str = "rule"

    def __call__(self, role: Role, seed: int) -> Negotiator:
        inner = resolve(self.spec)(role, seed)
        return RecordingSeller(inner) if Role(role) is Role.SELLER else inner


WARM_START_ARM = "warm-start"


def record_transcripts(
    scenarios: Sequence[Scenario],
    n: int,
    sellers: Sequence[str],
    pool: BuyerPool,
    seed: int,
    writer: TranscriptWriter | None = None,
    pick: str = "mixture",
) -> list[CompactTrace]:
    """``n`` rule-seller episodes on the training scenarios (cycled), against buyers drawn from ``pool``, played by
    the episode runner (written to ``writer``'s transcripts as the ``warm-start`` arm when one is given).

    ``pick="mixture"``: each episode is played by one seller drawn from ``sellers``. ``pick="best"``: every seller
    plays each episode (the same scenario, buyer and seed), and the episode of the one whose seller utility is highest
    is kept (the first listed among equals): the imitated policy is the best of the rules for that negotiation."""
    rng = np.random.default_rng([seed, 1])
    canonical = {s: resolve(s).spec for s in sellers}
    specs = list(canonical.values())
    jobs = []
    for i in range(n):
        drawn = specs[int(rng.integers(len(specs)))]
        buyer = pool.draw(rng)
        job_seed = int(rng.integers(2**31))
        sc = scenarios[i % len(scenarios)]
        for k, seller in enumerate(specs if pick == "best" else [drawn]):
            suffix = f"-{k}" if pick == "best" else ""
            jobs.append(Job(sc, seller, buyer, job_seed, f"warm-{i:06d}{suffix}", "warm-start", WARM_START_ARM))
    with EpisodeRunner({s: RecordingFactory(s) for s in specs}, writer=writer) as runner:
        played = runner.play(jobs)
    if pick != "best":
        return [p.seller_record for p in played]
    k = len(specs)
    return best_episodes([played[i * k : (i + 1) * k] for i in range(n)])


def best_episodes(tries: Sequence[Sequence[Any]]) -> list[CompactTrace]:
    """Per episode, the recorded trace of the try with the highest seller utility (the first among equals)."""
    return [max(group, key=lambda p: p.result.outcome.seller_utility).seller_record for group in tries]


@dataclass(frozen=True, slots=True)
class SFTResult:
    steps: int
    first_loss: float
    final_loss: float
    seconds: float
    episodes: int


def _tensors(traces: Sequence[CompactTrace], vocab: dict[str, int]) -> tuple[Any, Any, Any]:
    import torch

    seqs = [[vocab[w] for w in t.prompt + t.words] for t in traces]
    masks = [[0] * len(t.prompt) + t.mask for t in traces]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), vocab["<pad>"], dtype=torch.long)
    labels = torch.full_like(ids, -100)
    att = torch.zeros_like(ids)
    for i, (s, m) in enumerate(zip(seqs, masks, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
        labels[i, : len(s)] = torch.tensor([tok if own else -100 for tok, own in zip(s, m, strict=True)])
    return ids, att, labels


GROUP_OVERHEAD_TOKENS = 128
"""What one more forward and backward pass costs, counted in padded tokens read: the price :func:`length_groups`
weighs against the padding a split saves (small passes use the matrix kernels less well; on one thread of a 2-core
CPU with the tiny model, 96 to 256 read a batch of 32 fastest, 8 and 32 clearly slower)."""


def length_groups(lengths: Sequence[int], overhead: int = GROUP_OVERHEAD_TOKENS) -> list[list[int]]:
    """The indices of ``lengths`` split into groups of similar length, so that the padded tokens a pass reads (rows x
    the group's longest) plus ``overhead`` per pass add up to the least: rows sorted by length, cut points by
    dynamic programming (a batch of 32 takes a few hundred additions)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    longest = [lengths[i] for i in order]
    best = [0] + [math.inf] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(end):
            cost = best[start] + (end - start) * longest[end - 1] + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(order)
    while end > 0:
        groups.append(order[cut[end] : end])
        end = cut[end]
    return groups[::-1]


def behaviour_clone(
    model: Any,
    tokenizer: Any,
    traces: Sequence[CompactTrace],
    *,
    steps: int,
    lr: float,
    batch: int,
    seed: int,
    deadline: float | None = None,
    echo: Any = None,
    by_length: bool = True,
) -> SFTResult:
    """Next-token training on the sellers' own words (right-padded; warm-up then cosine decay).

    Each step's batch is read in passes over rows of similar length (:func:`length_groups`), whose gradients add up
    to the gradient of the whole batch's mean loss (``by_length=False`` reads it in one pass padded to its longest
    row: the same step, slower). Stops early (and says so in the result) once ``time.perf_counter()`` passes
    ``deadline``."""
    import torch

    t0 = time.perf_counter()
    ids, att, labels = _tensors(traces, tokenizer.get_vocab())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    )
    gen = torch.Generator().manual_seed(seed)
    model.train()
    first = last = math.nan
    done = 0
    for step in range(steps):
        if deadline is not None and time.perf_counter() > deadline:
            break
        idx = torch.randint(0, ids.size(0), (batch,), generator=gen)
        last = _accumulate(model, ids[idx], att[idx], labels[idx], by_length)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        first = last if step == 0 else first
        done = step + 1
        if echo is not None and done % 50 == 0:
            echo(f"warm start: step {done}/{steps}, loss {last:.3f}, {time.perf_counter() - t0:.0f}s")
    model.eval()
    return SFTResult(done, first, last, time.perf_counter() - t0, len(traces))


def _accumulate(model: Any, ids: Any, att: Any, labels: Any, by_length: bool) -> float:
    """Backpropagate the batch's mean loss over its own tokens, pass by pass; returns that loss."""
    lengths = att.sum(1)
    counted = max(1, int((labels[:, 1:] != -100).sum()))  # the tokens the model predicts (labels shift by one)
    groups = length_groups(lengths.tolist()) if by_length else [list(range(len(lengths)))]
    total = 0.0
    for group in groups:
        width = int(lengths[group].max())  # right padding: drop columns no row of this pass uses
        rows = (ids[group, :width], att[group, :width], labels[group, :width])
        loss = model(input_ids=rows[0], attention_mask=rows[1], labels=rows[2], num_items_in_batch=counted).loss
        loss.backward()
        total += float(loss.detach())
    return total
