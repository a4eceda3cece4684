"""The order of training scenarios depends on (seed, epoch) only, so a run resumed in a later epoch keeps it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from nego.training.prompt_order import EpochSeeded
from trl.trainer.utils import RepeatSampler


def _sampler(seed: int) -> EpochSeeded:
    return EpochSeeded(RepeatSampler(list(range(12)), mini_repeat_count=2, batch_size=3, seed=seed), seed)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), epoch=st.integers(1, 5))
def test_an_epoch_has_the_same_order_whether_or_not_the_earlier_ones_were_drawn(seed, epoch):
    through = _sampler(seed)
    for e in range(epoch):
        through.set_epoch(e)
        list(through)
    through.set_epoch(epoch)
    resumed = _sampler(seed)
    resumed.set_epoch(epoch)
    assert list(through) == list(resumed)


@given(seed=st.integers(0, 10_000))
def test_the_first_epoch_keeps_the_order_trl_gives(seed):
    wrapped = _sampler(seed)
    wrapped.set_epoch(0)
    plain = RepeatSampler(list(range(12)), mini_repeat_count=2, batch_size=3, seed=seed)
    assert list(wrapped) == list(plain) and len(wrapped) == len(plain)
