"""The order in which GRPO meets the training scenarios, made a function of (seed, epoch) so resuming keeps it.

TRL's prompt sampler shuffles every epoch with one random generator seeded once, so the order of epoch ``k`` depends
on the ``k`` epochs drawn before it. A run resumed after its first epoch has drawn none of them and would meet the
scenarios in the first epoch's order again. :class:`EpochSeeded` re-seeds the sampler at the start of each epoch
(the trainer announces it through ``set_epoch``) with ``seed + epoch``; epoch 0 keeps TRL's own order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class EpochSeeded:
    """A prompt sampler whose order in epoch ``k`` is the one its generator gives from ``seed + k``."""

    def __init__(self, inner: Any, seed: int) -> None:
        self.inner = inner
        self.seed = seed

    def set_epoch(self, epoch: int) -> None:
        generator = getattr(self.inner, "generator", None)
        if generator is not None:
            generator.manual_seed(self.seed + epoch)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)
