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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from nego.agents.compact.protocol import CompactTrace, action_words, parse_action
from nego.agents.registry import resolve
from nego.market.marketplace import Job, Played
from nego.market.protocol import Negotiator
from nego.market.types import Action, NegotiationResult, Observation
from nego.scenarios.scenario import Role, Scenario

from .pool import BuyerPool
from .runner import EpisodeRunner

if TYPE_CHECKING:
    from nego.market.transcripts import TranscriptWriter


class RecordingSeller:
    """Wraps a rule-based seller: plays its move as the compact protocol would express it, and records it."""

    def __init__(self, inner: Negotiator, aims: bool = False) -> None:
        self.inner = inner
        self.aims = aims
        self.trace = CompactTrace(Role.SELLER)

    async def act(self, obs: Observation) -> Action:
        self.trace.observe(obs)
        words = action_words(obs.scenario, await self.inner.act(obs), self.aims)
        self.trace.add(words, own=True)
        return parse_action(obs.scenario, words, lambda: self.trace.outcome_space(obs.scenario))

    def record(self, result: NegotiationResult) -> CompactTrace:
        self.trace.finish(result.outcome)
        return self.trace


@dataclass(frozen=True, slots=True)
class RecordingFactory:
    """A rule-based spec whose sellers are recorded in the compact protocol (its buyers play unchanged); ``aims``
    records offers as aim words."""

    spec: str
    kind: str = "rule"
    aims: bool = False

    def __call__(self, role: Role, seed: int) -> Negotiator:
        inner = resolve(self.spec)(role, seed)
        return RecordingSeller(inner, self.aims) if Role(role) is Role.SELLER else inner


WARM_START_ARM = "warm-start"


def record_transcripts(
    scenarios: Sequence[Scenario],
    n: int,
    sellers: Sequence[str],
    pool: BuyerPool,
    seed: int,
    writer: TranscriptWriter | None = None,
    pick: str = "mixture",
    aims: bool = False,
) -> list[CompactTrace]:
    """``n`` rule-seller episodes recorded in the compact protocol: :func:`play_warm_start` with every seller
    wrapped in a :class:`RecordingSeller` (offers as aim words with ``aims``), the recorded trace of each kept
    episode."""
    played = play_warm_start(scenarios, n, sellers, pool, seed, writer, pick, aims=aims)
    return [p.seller_record for p in played]


def play_warm_start(
    scenarios: Sequence[Scenario],
    n: int,
    sellers: Sequence[str],
    pool: BuyerPool,
    seed: int,
    writer: TranscriptWriter | None = None,
    pick: str = "mixture",
    *,
    record: bool = True,
    aims: bool = False,
) -> list[Played]:
    """``n`` rule-seller episodes on the training scenarios (cycled), against buyers drawn from ``pool``, played by
    the episode runner (written to ``writer``'s transcripts as the ``warm-start`` arm when one is given); ``record``
    wraps every seller in a :class:`RecordingSeller` (the compact protocol; offers as aim words with ``aims``), else
    the rule sellers play as they are.

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
    learners = {s: RecordingFactory(s, aims=aims) for s in specs} if record else {}
    with EpisodeRunner(learners, writer=writer) as runner:
        played = runner.play(jobs)
    if pick != "best":
        return played
    k = len(specs)
    return best_episodes([played[i * k : (i + 1) * k] for i in range(n)])


def best_episodes(tries: Sequence[Sequence[Played]]) -> list[Played]:
    """Per episode, the try with the highest seller utility (the first among equals)."""
    return [max(group, key=lambda p: p.result.outcome.seller_utility) for group in tries]


@dataclass(frozen=True, slots=True)
class SFTResult:
    steps: int
    first_loss: float
    final_loss: float
    seconds: float
    episodes: int


@dataclass(frozen=True, slots=True)
class Example:
    """One behaviour-cloning sequence as token ids, with its loss mask (1 on the seller's own ids)."""

    ids: Sequence[int]
    mask: Sequence[int]


def compact_examples(traces: Sequence[CompactTrace], vocab: dict[str, int]) -> list[Example]:
    """Compact-protocol traces as id sequences: prompt words are context, the seller's words are trained."""
    return [Example([vocab[w] for w in t.prompt + t.words], [0] * len(t.prompt) + t.mask) for t in traces]


def _tensors(traces: Sequence[CompactTrace], vocab: dict[str, int]) -> tuple[Any, Any, Any]:
    return _padded(compact_examples(traces, vocab), vocab["<pad>"])


def _padded(examples: Sequence[Example], pad_id: int) -> tuple[Any, Any, Any]:
    """(ids, attention mask, labels) of ``examples`` right-padded to the longest; labels are -100 off the mask."""
    import torch

    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    att = torch.zeros_like(ids)
    for i, e in enumerate(examples):
        ids[i, : len(e.ids)] = torch.tensor(list(e.ids))
        att[i, : len(e.ids)] = 1
        labels[i, : len(e.ids)] = torch.tensor([tok if own else -100 for tok, own in zip(e.ids, e.mask, strict=True)])
    return ids, att, labels


GROUP_OVERHEAD_TOKENS = 128
"""What one more forward and backward pass costs, counted in padded tokens read: the price :func:`length_groups`
weighs against the padding a split saves (small passes use the matrix kernels less well; on one thread of a 2-core
CPU with the tiny model, 96 to 256 read a batch of 32 fastest, 8 and 32 clearly slower)."""


def length_groups(
    lengths: Sequence[int], overhead: int = GROUP_OVERHEAD_TOKENS, max_tokens: int | None = None
) -> list[list[int]]:
    """The indices of ``lengths`` split into groups of similar length, so that the padded tokens a pass reads (rows x
    the group's longest) plus ``overhead`` per pass add up to the least: rows sorted by length, cut points by
    dynamic programming (a batch of 32 takes a few hundred additions). ``max_tokens`` caps the padded tokens of a
    pass (what its activations hold in memory); a row longer than the cap gets a pass of its own."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    longest = [lengths[i] for i in order]
    best = [0] + [math.inf] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(end):
            rows = end - start
            if max_tokens is not None and rows > 1 and rows * longest[end - 1] > max_tokens:
                continue
            cost = best[start] + rows * longest[end - 1] + overhead
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
    traces: Sequence[CompactTrace] | Sequence[Example],
    *,
    steps: int,
    lr: float,
    batch: int,
    seed: int,
    deadline: float | None = None,
    echo: Any = None,
    by_length: bool = True,
    echo_every: int = 50,
    pass_tokens: int | None = None,
) -> SFTResult:
    """Next-token training on the sellers' own words (right-padded; warm-up then cosine decay): compact traces with
    the tiny model's tokenizer, or :class:`Example` s (any model: a chat model's rendered episodes).

    Each step's batch is read in passes over rows of similar length (:func:`length_groups`), whose gradients add up
    to the gradient of the whole batch's mean loss (``by_length=False`` reads it in one pass padded to its longest
    row: the same step, slower); ``pass_tokens`` caps the padded tokens of one pass, which bounds the activations
    held in memory (long chat episodes) at the same step. Stops early (and says so in the result) once
    ``time.perf_counter()`` passes ``deadline``."""
    import torch

    t0 = time.perf_counter()
    examples = bool(traces) and isinstance(traces[0], Example)
    if examples:
        ids, att, labels = _padded(traces, pad_id(tokenizer))
    else:
        ids, att, labels = _tensors(traces, tokenizer.get_vocab())
    selective = examples and plain_head(model)
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
        last = _accumulate(model, ids[idx], att[idx], labels[idx], by_length, selective, pass_tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        first = last if step == 0 else first
        done = step + 1
        if echo is not None and done % echo_every == 0:
            echo(f"warm start: step {done}/{steps}, loss {last:.3f}, {time.perf_counter() - t0:.0f}s")
    model.eval()
    return SFTResult(done, first, last, time.perf_counter() - t0, len(traces))


def clone_for_run(
    model: Any,
    tokenizer: Any,
    traces: Sequence[CompactTrace] | Sequence[Example],
    cfg: Any,
    started: float,
    echo: Any,
    cut_short: Path,
    echo_every: int = 50,
    pass_tokens: int | None = None,
) -> SFTResult:
    """A run's warm start (:func:`behaviour_clone` with ``cfg``'s settings), said in ``echo``: it may use at most a
    third of the run's time budget, so GRPO always gets the rest; cut short, it says so and writes ``cut_short``."""
    deadline = started + cfg.time_budget_min * 20 if cfg.time_budget_min else None
    r = behaviour_clone(
        model,
        tokenizer,
        traces,
        steps=cfg.sft_steps,
        lr=cfg.sft_lr,
        batch=cfg.sft_batch,
        seed=cfg.seed,
        deadline=deadline,
        echo=echo,
        echo_every=echo_every,
        pass_tokens=pass_tokens,
    )
    echo(f"warm start: {r.steps} SFT steps, loss {r.first_loss:.3f} -> {r.final_loss:.3f}, {r.seconds:.0f}s")
    if r.steps < cfg.sft_steps:
        echo(
            f"WARNING: the time cap (time_budget_min={cfg.time_budget_min:g}) cut the warm start short at "
            f"{r.steps} of {cfg.sft_steps} steps"
        )
        cut_short.parent.mkdir(parents=True, exist_ok=True)
        cut_short.write_text(f"{r.steps}/{cfg.sft_steps} warm-start steps\n")
    return r


def pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def _accumulate(
    model: Any,
    ids: Any,
    att: Any,
    labels: Any,
    by_length: bool,
    selective: bool = False,
    pass_tokens: int | None = None,
) -> float:
    """Backpropagate the batch's mean loss over its own tokens, pass by pass; returns that loss. ``selective``
    applies the output layer only where a token is trained (a chat model's vocabulary makes that layer a fifth of
    the compute, and most of an episode is prompt)."""
    lengths = att.sum(1)
    counted = max(1, int((labels[:, 1:] != -100).sum()))  # the tokens the model predicts (labels shift by one)
    groups = length_groups(lengths.tolist(), max_tokens=pass_tokens) if by_length else [list(range(len(lengths)))]
    total = 0.0
    for group in groups:
        width = int(lengths[group].max())  # right padding: drop columns no row of this pass uses
        rows = (ids[group, :width], att[group, :width], labels[group, :width])
        if selective:
            loss = _selected_loss(model, *rows, counted)
        else:
            loss = model(input_ids=rows[0], attention_mask=rows[1], labels=rows[2], num_items_in_batch=counted).loss
        loss.backward()
        total += float(loss.detach())
    return total


def plain_head(model: Any) -> bool:
    """Whether the model's logits are its output layer applied to its decoder's last hidden states and nothing more
    (no final soft-capping or scaling, as Gemma and Cohere models apply), so the layer can be applied selectively."""
    config = getattr(model, "config", None)
    scaled = any(getattr(config, k, None) is not None for k in ("final_logit_softcapping", "logit_scale"))
    return not scaled and hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings")


def _selected_loss(model: Any, ids: Any, att: Any, labels: Any, counted: int) -> Any:
    """The summed next-token loss of the trained positions over ``counted``: the decoder's hidden states, and the
    output layer applied only at positions whose next token is trained."""
    import torch

    hidden = model.get_decoder()(input_ids=ids, attention_mask=att).last_hidden_state
    keep = labels[:, 1:] != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][keep]).float()
    return torch.nn.functional.cross_entropy(logits, labels[:, 1:][keep], reduction="sum") / counted
