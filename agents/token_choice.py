"""Choosing a batch's next tokens so that no row's choice depends on the rows beside it.

A batched forward pass gives a row's logits only up to float rounding that depends on the batch: matrix kernels are
picked by the number of rows, attention sums run over the batch's padded width. In float32 a logit moves by up to
about 2e-5 on the tiny models (``bench/results/batch_invariance.txt``), and a sampled choice whose two best candidates
are closer than that could go either way. So every row runs its exponential race (the largest ``p / E``,
``E ~ Exp(1)`` from the row's own generator; ``E = 1`` for a greedy row) on its batched values, and a row whose winner
leads the runner-up by less than :data:`MARGIN` (in log) is decided again on its values computed alone: from its own
tokens, in a batch of one. A lead is ``(logit_a - logit_b) / T`` plus the noise term, so rounding of at most ``d`` in
every logit moves it by at most ``2 d / T``, and a token is the one the row's lone values choose whenever
``d < MARGIN * T / 2``:

- a clear winner in the batch leads by at least ``MARGIN``, so it still leads on the lone values;
- a close one is decided on the lone values themselves.

Nothing here imports torch: the callers hand in their tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MARGIN = 1e-3
"""The log-lead below which a row's choice is made again on its lone values. Its half, 5e-4, is 19 times the largest
batch rounding measured on the tiny compact model at its temperature of 0.7 (2.7e-5 after dividing by T) and hundreds
of times that of the tiny chat model; about one token in 3,600 of the warm-started compact model's and one in 1,000 of
the random chat model's is then decided again alone."""


def choose(values: Any, alone: Callable[[int], Any | None]) -> Any:
    """Each row's winning token (``values``: ``[rows, vocab]`` race values ``p / E``, all >= 0), a row whose winner
    leads by less than :data:`MARGIN` taking the argmax of ``alone(row)`` instead (None: the row needs no token, keep
    the batched one). Returns a long tensor ``[rows]``."""
    top = values.topk(2, dim=-1)
    tokens = top.indices[:, 0].clone()
    lead = (top.values[:, 0] / top.values[:, 1]).log()
    for row in (~(lead >= MARGIN)).nonzero()[:, 0].tolist():  # a NaN lead (two infinite values) is close too
        lone = alone(row)
        if lone is not None:
            tokens[row] = lone.argmax()
    return tokens
