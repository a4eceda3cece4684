"""Summaries: per-spec numbers from a negotiations table, and the same numbers kept live from events."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.market.events import EventBus
from nego.market.marketplace import Job, Marketplace, run_jobs
from nego.market.summary import SUMMARY_SCHEMA, RunningStats, summarize
from nego.market.transcripts import TranscriptWriter, read_negotiations
from polars.testing import assert_frame_equal

from ..conftest import make_widget_scenario
from .fakes import BrokenFactory, Factory

SC = make_widget_scenario()


def specs() -> dict[str, object]:
    return {
        "a": Factory("a"),
        "sloppy": Factory("sloppy", invalid_first=True, tokens=10),
        "b": Factory("b"),
        "broken": BrokenFactory("broken"),
    }


def test_summary_counts_errors_apart_and_rates_per_side(tmp_path):
    jobs = [Job(SC, "a", "b", i) for i in range(4)] + [Job(SC, "sloppy", "broken", i) for i in range(2)]
    jobs += [Job(SC, "sloppy", "b", i) for i in range(3)]
    results = run_jobs(specs(), jobs, writer=TranscriptWriter(tmp_path))
    frame = summarize(read_negotiations(tmp_path))
    assert frame.schema == SUMMARY_SCHEMA and frame["spec"].to_list() == ["a", "sloppy"]
    sloppy = frame.row(1, named=True)
    assert (sloppy["n"], sloppy["errors"], sloppy["deals"]) == (5, 2, 3)
    assert sloppy["deal_rate"] == 1.0  # errors are not no-deals
    assert sloppy["mean_seller_utility"] == pytest.approx(sum(r.outcome.seller_utility for r in results[6:]) / 3)
    sloppy_results = results[4:]
    attempts = sum(t.role.value == "seller" for r in sloppy_results for t in r.turns)
    assert sloppy["invalid_rate"] == pytest.approx(5 / attempts)
    assert sloppy["tokens"] == sum(r.usage_seller.prompt_tokens + r.usage_seller.completion_tokens for r in results)
    assert frame.row(0, named=True)["invalid_rate"] == 0.0
    buyers = summarize(read_negotiations(tmp_path), by="buyer")
    broken = buyers.filter(pl.col("spec") == "broken").row(0, named=True)
    assert broken["errors"] == 2 and broken["deal_rate"] is None and broken["mean_rounds"] is None
    with pytest.raises(ValueError, match="seller' or 'buyer"):
        summarize(frame, by="arm")  # type: ignore[arg-type]


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "sloppy"]), st.sampled_from(["b", "broken"])), min_size=1, max_size=8))
def test_running_stats_match_the_table_summary(tmp_path_factory, pairs):
    directory = tmp_path_factory.mktemp("run")
    jobs = [Job(SC, s, b, i) for i, (s, b) in enumerate(pairs)]
    bus, live = EventBus(), RunningStats()
    bus.subscribe(live)
    run_jobs(specs(), jobs, bus=bus, writer=TranscriptWriter(directory))
    table = read_negotiations(directory)
    assert live.count == len(jobs)
    for by in ("seller", "buyer"):
        assert_frame_equal(live.frame(by), summarize(table, by=by), check_exact=False)


async def test_a_later_attempt_replaces_the_earlier_one(tmp_path):
    jobs = [Job(SC, "a", "flaky", i) for i in range(3)]
    live = RunningStats()
    bus = EventBus()
    bus.subscribe(live)
    first = {"a": Factory("a"), "flaky": BrokenFactory("flaky")}
    await Marketplace(first, bus=bus, writer=TranscriptWriter(tmp_path)).run(jobs)
    assert live.frame("buyer").row(0, named=True)["errors"] == 3
    await Marketplace({"a": Factory("a"), "flaky": Factory("flaky")}, bus=bus, writer=TranscriptWriter(tmp_path)).run(
        jobs
    )
    row = live.frame("buyer").row(0, named=True)
    assert (row["n"], row["errors"], row["deals"]) == (3, 0, 3)
    assert_frame_equal(live.frame("buyer"), summarize(read_negotiations(tmp_path), by="buyer"), check_exact=False)
