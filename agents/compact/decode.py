"""Batched decoding for the compact tiny model: the loop behind its turns (chat models decode through the in-process
engine, :mod:`nego.agents.llm.backends.hf_engine`).

:func:`generate_turns` answers a batch of requests (context ids, a cap on new tokens, a temperature, a generator)
with each row's new tokens and their log-probabilities. A context is read in one of two ways:

- **re-read**: the whole context goes through the model's own forward every turn (any causal LM);
- **kept**: a request carrying a :class:`~nego.agents.compact.protocol.KVCache` (the compact policy on a
  ``Qwen2ForCausalLM``) reads only the tokens its cache has not seen and leaves the cache holding everything it read, so
  a negotiation's turn costs the words it adds instead of the whole episode again (re-reading costs the square of its
  length).

The kept path runs the model's own modules (embeddings, norms, projections, rotary embedding, MLPs) in a batch
laid out so that a row's column is its token's position: each row's cached keys and values are copied in at their
positions, new tokens are written at theirs (padding goes to a spare column nobody reads), and a query attends to
the columns up to its own position. No row sees padding or another row, and positions need no bookkeeping.

A row's tokens do not depend on its batch: its generator is drawn from only for the tokens it chooses, and a choice
that batch-dependent float rounding could flip is made on the row's logits read alone (:mod:`nego.agents.token_choice`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn import functional as F

from ..token_choice import choose

Result = tuple[list[int], list[float]]


def generate_turns(model: Any, batch: Sequence[Any], pad_id: int, stop_id: int) -> list[Result]:
    """Decode every request of ``batch`` until ``stop_id`` or its ``max_new`` tokens; rows with a cache keep it.

    Rows sample with their own generator, drawing only for the tokens they choose, and a close choice is made again on
    the row's logits read alone, so a negotiation's tokens do not depend on its batch mates (see :class:`_Picker`).
    Each chosen token comes with its log-probability under ``softmax(logits / temperature)``, the quantity the GRPO
    trainer recomputes; greedy rows report it at temperature 1."""
    with torch.no_grad():
        if any(getattr(r, "cache", None) is not None for r in batch):
            return _generate_kept(model, batch, pad_id, stop_id)
        return _generate_reread(model, batch, pad_id, stop_id)


def supports_kept_cache(model: Any) -> bool:
    """Whether :func:`generate_turns` can keep a cache across turns for ``model`` (a plain ``Qwen2ForCausalLM``
    with full attention in every layer: the shape of every compact model ``nego train`` builds)."""
    from transformers import Qwen2ForCausalLM

    if not isinstance(model, Qwen2ForCausalLM):
        return False
    types = getattr(model.config, "layer_types", None) or ["full_attention"]
    parts = ("input_layernorm", "post_attention_layernorm", "mlp", "self_attn")
    layers_fit = all(hasattr(layer, p) for layer in model.model.layers for p in parts)
    return all(t == "full_attention" for t in types) and layers_fit and hasattr(model.model, "rotary_emb")


def _generate_reread(model: Any, batch: Sequence[Any], pad_id: int, stop_id: int) -> list[Result]:
    """The model's own forward over left-padded contexts, then a decoding loop with the model's own cache."""
    n, width = len(batch), max(len(r.ids) for r in batch)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    att = torch.zeros((n, width), dtype=torch.long)
    for row, r in enumerate(batch):
        ids[row, width - len(r.ids) :] = torch.tensor(r.ids)
        att[row, width - len(r.ids) :] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    device = next(model.parameters()).device
    res = model(input_ids=ids.to(device), attention_mask=att.to(device), position_ids=pos.to(device), use_cache=True)
    loop = _Loop(model, batch, stop_id)
    while True:
        feed = loop.step(res.logits[:, -1, :])
        if feed is None:
            return loop.results()
        nxt = torch.tensor([pad_id if t is None else t for t in feed], dtype=torch.long)
        att = torch.cat([att, torch.ones((n, 1), dtype=torch.long)], 1)
        pos = pos[:, -1:] + 1
        res = model(
            input_ids=nxt[:, None].to(device),
            attention_mask=att.to(device),
            position_ids=pos.to(device),
            cache=res.cache,
            use_cache=True,
        )


def _generate_kept(model: Any, batch: Sequence[Any], pad_id: int, stop_id: int) -> list[Result]:
    """Read only what each row's cache has not seen, decode, and leave every cache holding what its row read (all
    but the last chosen token, which the next turn reads first)."""
    net = _Qwen2(model)
    n = len(batch)
    kept = [_reusable(r) for r in batch]
    fresh = [r.ids[k:] for r, k in zip(batch, kept, strict=True)]
    spare = max(k + len(f) + r.max_new for r, k, f in zip(batch, kept, fresh, strict=True))
    kv = net.buffer(n, spare + 1)  # column `spare` takes the padding's keys and values; no query reaches it
    for row, (r, k) in enumerate(zip(batch, kept, strict=True)):
        if k:
            kv[:, :, row, :, :k] = r.cache.kv[:, :, :, :k]
    width = max(map(len, fresh))
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    pos = torch.zeros((n, width), dtype=torch.long)
    cols = torch.full((n, width), spare, dtype=torch.long)
    for row, (k, f) in enumerate(zip(kept, fresh, strict=True)):
        ids[row, width - len(f) :] = torch.tensor(f)
        pos[row, width - len(f) :] = cols[row, width - len(f) :] = torch.arange(k, k + len(f))
    length = [k + len(f) for k, f in zip(kept, fresh, strict=True)]
    logits = net(ids, pos, cols, kv, max(length))
    loop = _Loop(model, batch, stop_id)
    while True:
        feed = loop.step(logits)
        if feed is None:
            break
        ids = torch.tensor([[pad_id if t is None else t] for t in feed], dtype=torch.long)
        pos = torch.tensor([[0 if t is None else length[row]] for row, t in enumerate(feed)], dtype=torch.long)
        cols = torch.tensor([[spare if t is None else length[row]] for row, t in enumerate(feed)], dtype=torch.long)
        length = [m + (t is not None) for m, t in zip(length, feed, strict=True)]
        logits = net(ids, pos, cols, kv, max(length))
    results = loop.results()
    for row, (r, (out, _)) in enumerate(zip(batch, results, strict=True)):
        if r.cache is not None:
            r.cache.ids = [*r.ids, *out[:-1]]
            r.cache.kv = kv[:, :, row, :, : length[row]].clone()
    return results


def _reusable(request: Any) -> int:
    """How many leading tokens of the request's context its cache already holds (at least one token is left to
    read, whose logits start the turn)."""
    cache = request.cache
    if cache is None or cache.kv is None:
        return 0
    known, ids = cache.ids, request.ids
    if ids[: len(known)] == known:
        return min(len(known), len(ids) - 1)
    same = 0
    for a, b in zip(known, ids, strict=False):
        if a != b:
            break
        same += 1
    return min(same, len(ids) - 1)


class _Qwen2:
    """A forward pass through a ``Qwen2ForCausalLM``'s own modules that writes keys and values into a position-indexed
    buffer ``[layers, 2, rows, kv_heads, columns, head_dim]`` and returns the logits of each row's last token."""

    def __init__(self, model: Any) -> None:
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        self.rotate = apply_rotary_pos_emb
        self.base = model.model
        self.head = model.lm_head
        cfg = model.config
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.gqa = cfg.num_attention_heads != cfg.num_key_value_heads
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype

    def buffer(self, rows: int, columns: int) -> torch.Tensor:
        # zeros, not empty: a masked column still multiplies its value by a zero weight, and 0 * NaN is NaN
        shape = (len(self.base.layers), 2, rows, self.kv_heads, columns, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, cols: torch.Tensor, kv: torch.Tensor, span: int):
        n, t = ids.shape
        ids, pos, cols = ids.to(self.device), pos.to(self.device), cols.to(self.device)
        rows = torch.arange(n, device=self.device)[:, None]
        mask = (torch.arange(span, device=self.device) <= pos[..., None])[:, None]  # [n, 1, t, span]
        h = self.base.embed_tokens(ids)
        cos, sin = self.base.rotary_emb(h, pos)
        for i, layer in enumerate(self.base.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(n, t, -1, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(n, t, -1, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(n, t, -1, self.head_dim).transpose(1, 2)
            q, k = self.rotate(q, k, cos, sin)
            keys, values = kv[i, 0], kv[i, 1]
            keys[rows, :, cols] = k.transpose(1, 2)
            values[rows, :, cols] = v.transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q, keys[:, :, :span], values[:, :, :span], attn_mask=mask, scale=attn.scaling, enable_gqa=self.gqa
            )
            h = h + attn.o_proj(o.transpose(1, 2).reshape(n, t, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.head(self.base.norm(h[:, -1]))


class _Loop:
    """The decoding loop's bookkeeping, shared by both ways of reading: picks every row's next token from the last
    logits, records tokens and log-probabilities, and says which token each row feeds next (None once it is done)."""

    def __init__(self, model: Any, batch: Sequence[Any], stop_id: int) -> None:
        self.model, self.batch, self.stop_id = model, batch, stop_id
        self.pick = _Picker(batch)
        self.out_ids: list[list[int]] = [[] for _ in batch]
        self.out_lp: list[list[float]] = [[] for _ in batch]
        self.done = [False] * len(batch)

    def step(self, logits: torch.Tensor) -> list[int | None] | None:
        toks, logps = self.pick(logits.float().cpu(), self.done, self.alone)
        for row, r in enumerate(self.batch):
            if self.done[row]:
                continue
            self.out_ids[row].append(toks[row])
            self.out_lp[row].append(logps[row])
            self.done[row] = toks[row] == self.stop_id or len(self.out_ids[row]) >= r.max_new
        if all(self.done):  # every row is done by its own max_new at the latest
            return None
        return [None if d else t for d, t in zip(self.done, toks, strict=True)]

    def alone(self, row: int) -> torch.Tensor:
        """The next-token logits of ``row`` read alone by the model's own forward: its context and this turn's tokens
        so far, in a batch of one, without a cache (a function of the row's tokens only)."""
        ids = torch.tensor([[*self.batch[row].ids, *self.out_ids[row]]], device=next(self.model.parameters()).device)
        return self.model(input_ids=ids, use_cache=False).logits[0, -1].float().cpu()

    def results(self) -> list[Result]:
        return list(zip(self.out_ids, self.out_lp, strict=True))


class _Picker:
    """Chooses every row's next token at once by an exponential race (argmax of p / E, E ~ Exp(1) from the row's own
    generator, drawn only for the tokens the row chooses; E = 1 for a greedy row), close races decided again on the
    row's logits read alone (:func:`nego.agents.token_choice.choose`), so a row's tokens do not depend on its batch
    mates. Returns the tokens and their log-probabilities under softmax(logits / T)."""

    def __init__(self, batch: Sequence[Any]) -> None:
        self.temps = torch.tensor([[r.temperature or 1.0] for r in batch])
        self.generators = [r.generator if r.temperature is not None else None for r in batch]

    def __call__(
        self, logits: torch.Tensor, done: Sequence[bool], alone: Callable[[int], torch.Tensor]
    ) -> tuple[list[int], list[float]]:
        noise = torch.ones_like(logits)
        for row, gen in enumerate(self.generators):
            if gen is not None and not done[row]:
                noise[row].exponential_(generator=gen)
        logp = torch.log_softmax(logits / self.temps, -1)

        def lone(row: int) -> torch.Tensor | None:
            if done[row]:
                return None
            logp[row] = torch.log_softmax(alone(row) / self.temps[row], -1)
            return logp[row].exp() / noise[row]

        toks = choose(logp.exp() / noise, lone)
        return toks.tolist(), logp.gather(1, toks[:, None])[:, 0].tolist()
