"""The live view of `nego train`: curves that keep the whole run in view, the latest step, dev results, collapse."""

from __future__ import annotations

import math

from hypothesis import assume, given
from hypothesis import strategies as st
from nego.cli.train_live import BLOCKS, TrainWatch, sparkline
from nego.training.evaluate import BuyerResult, DevEvaluation
from rich.console import Console

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=500), st.integers(min_value=1, max_value=80))
def test_sparkline_has_one_block_per_value_up_to_the_width(values, width):
    line = sparkline(values, width)
    assert len(line) == min(len(values), width)
    assert set(line) <= set(BLOCKS)


@given(st.lists(finite, min_size=2, max_size=80, unique=True))
def test_sparkline_spans_low_to_high_and_keeps_order(values):
    assume(max(values) - min(values) > 1e-9)  # closer than that is drawn flat
    line = sparkline(values, width=80)
    lo, hi = values.index(min(values)), values.index(max(values))
    assert line[lo] == BLOCKS[0] and line[hi] == BLOCKS[-1]
    ranked = sorted(range(len(values)), key=values.__getitem__)
    assert [BLOCKS.index(line[i]) for i in ranked] == sorted(BLOCKS.index(line[i]) for i in ranked)


def test_sparkline_skips_missing_values_and_draws_a_flat_series_flat():
    assert sparkline([None, math.nan, 1.0, 2.0]) == BLOCKS[0] + BLOCKS[-1]
    assert len(set(sparkline([0.5] * 10))) == 1
    assert sparkline([]) == "" and sparkline([None]) == ""


def _row(step: int, reward: float, collapse: str = "") -> dict:
    return {
        "step": step,
        "reward_mean": reward,
        "deal_rate": 0.9 - step / 100,
        "entropy": 0.8,
        "invalid_rate": 0.05,
        "identical_group_share": 0.125,
        "kl": None,
        "tokens_per_s": 1500.0,
        "step_seconds": 2.0,
        "collapse": collapse,
    }


def _text(watch: TrainWatch) -> str:
    console = Console(record=True, width=140)
    console.print(watch.render())
    return console.export_text()


def _dev(step: int, **buyers: tuple[float, float]) -> DevEvaluation:
    results = [
        BuyerResult(b, (u,) * 50, (True,) * round(50 * d) + (False,) * (50 - round(50 * d)), (0,) * 50)
        for b, (u, d) in buyers.items()
    ]
    return DevEvaluation(step, tuple(results))


def test_the_view_shows_curves_latest_values_and_dev_results():
    watch = TrainWatch(steps=400, name="tiny", time_budget_min=13.5)
    assert "warm start" in _text(watch)
    watch.on_dev(_dev(0, tft=(0.539, 0.98), linear=(0.517, 0.98)))
    for step in range(1, 31):
        watch.on_step(_row(step, 0.4 + step / 100))
    watch.on_dev(_dev(30, tft=(0.6108, 0.86), linear=(0.645, 0.94)))
    text = _text(watch)
    assert "GRPO step 30/400" in text and "2.0 s/step" in text and "13.5 min" in text
    reward = next(line for line in text.splitlines() if line.strip().startswith("reward"))
    assert "0.410" in reward and "0.700" in reward and BLOCKS[0] in reward and BLOCKS[-1] in reward
    assert "0.539 / 0.98" in text and "0.611 / 0.86" in text  # base (step 0) and the latest dev evaluation
    assert "identical-reward groups 0.12" in text and "1,500 tokens/s" in text
    assert "collapsed" not in text and "Deals in training" not in text  # no training negotiation seen yet


def test_the_view_shows_the_tape_of_deals_of_training_negotiations():
    from nego.agents.registry import resolve
    from nego.market.marketplace import Job, run_jobs

    from ..conftest import make_widget_scenario

    watch = TrainWatch(steps=10)
    jobs = [Job(make_widget_scenario(), "conceder", "conceder", seed) for seed in range(3)]
    run_jobs(resolve, jobs, bus=watch.bus)
    text = _text(watch)
    assert "Deals in training negotiations (3 so far, 0 errors)" in text and "deal conceder vs conceder" in text


def test_a_collapse_is_flagged_in_the_view():
    watch = TrainWatch(steps=10)
    watch.on_step(_row(1, 0.5))
    watch.on_step(_row(2, 0.5, collapse="entropy 0.010 < 30% of initial 0.800"))
    assert "step 2 looks collapsed: entropy 0.010" in _text(watch)
