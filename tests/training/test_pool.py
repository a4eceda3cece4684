"""The training buyer pool: what one draw can be, how often each entry comes up, and that it repeats per seed."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from nego.agents.registry import rule_family
from nego.agents.rules.heldout import HELD_OUT_FAMILIES
from nego.training.config import DEFAULT_TRAIN_BUYERS
from nego.training.pool import BuyerPool


@given(seed=st.integers(0, 2**32 - 1))
def test_a_draw_names_one_entry_with_its_ranges_drawn_inside_their_bounds(seed):
    pool = BuyerPool(("reciprocal:r=0.5..1.5,harden=0..0.5", "tft"))
    spec = pool.draw(np.random.default_rng(seed))
    if spec != "tft":
        m = re.fullmatch(r"reciprocal:r=([0-9.]+),harden=([0-9.]+)", spec)
        assert m is not None, spec
        assert 0.5 <= float(m[1]) <= 1.5 and 0.0 <= float(m[2]) <= 0.5


def test_an_entry_listed_k_times_is_drawn_k_times_as_often():
    pool = BuyerPool(("tft", "reciprocal", "reciprocal", "reciprocal"))
    rng = np.random.default_rng(7)
    counts = Counter(pool.draw(rng) for _ in range(8000))
    assert abs(counts["reciprocal"] / 8000 - 0.75) < 0.02


def test_draws_repeat_per_seed():
    pool = BuyerPool(DEFAULT_TRAIN_BUYERS)
    first = [pool.draw(np.random.default_rng(3)) for _ in range(2)]
    assert first[0] == first[1]
    rng_a, rng_b = np.random.default_rng(11), np.random.default_rng(11)
    assert [pool.draw(rng_a) for _ in range(50)] == [pool.draw(rng_b) for _ in range(50)]


def test_the_default_pool_is_weighted_toward_buyers_that_punish_a_stall_and_never_draws_a_held_out_one():
    rng = np.random.default_rng(0)
    families = Counter(rule_family(BuyerPool(DEFAULT_TRAIN_BUYERS).draw(rng)) for _ in range(6000))
    assert not set(families) & set(HELD_OUT_FAMILIES)
    punishing = sum(families[f] for f in ("reciprocal", "outside", "hazard", "deadline")) / 6000
    assert abs(punishing - 9 / 12) < 0.025
    assert families["reciprocal"] > 4 * families["tft"]
