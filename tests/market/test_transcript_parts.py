"""Part files of a transcript directory: their names, which ones cover others, and the compaction plan."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from nego.market.transcript_parts import Span, covered, next_merge, tier


def test_part_names_round_trip_and_other_names_are_not_parts():
    for span in (Span(7, 7), Span(0, 15), Span(123456789, 123456790)):
        assert Span.parse(span.name) == span
    for name in (
        ".part-00000001.parquet.tmp",
        "part-00000003-00000003.parquet",
        "part-00000004-00000002.parquet",
        "part-x.parquet",
        "notes.txt",
    ):
        assert Span.parse(name) is None


def test_covered_finds_spans_inside_others_nested_or_not_and_never_a_span_itself():
    spans = [Span(0, 3), Span(0, 0), Span(2, 3), Span(4, 4), Span(0, 7), Span(8, 8)]
    assert covered(spans, [Span(0, 3)]) == {Span(0, 0), Span(2, 3)}
    assert covered(spans, [Span(0, 3), Span(0, 7)]) == {Span(0, 0), Span(2, 3), Span(0, 3), Span(4, 4)}
    assert covered(spans, []) == set()


@settings(max_examples=60, deadline=None)
@given(
    fanout=st.integers(2, 6),
    legacy=st.integers(0, 300),
    flushes=st.integers(0, 200),
)
def test_merges_keep_spans_contiguous_and_at_most_fanout_minus_one_per_tier(fanout, legacy, flushes):
    spans = [Span(n, n) for n in range(legacy)]  # a folder written without compaction, then opened with it

    def compact() -> None:
        while (run := next_merge(spans, fanout)) is not None:
            at = spans.index(run[0])
            spans[at : at + len(run)] = [Span(run[0].lo, run[-1].hi)]

    compact()
    for n in range(legacy, legacy + flushes):
        spans.append(Span(n, n))
        compact()
        tiers = [tier(s, fanout) for s in spans]
        assert tiers == sorted(tiers, reverse=True)
        assert all(tiers.count(t) < fanout for t in set(tiers))
        assert all(a.hi < b.lo for a, b in itertools.pairwise(spans))
