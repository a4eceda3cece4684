"""Calibration of the paired statistics: interval coverage, test size and power, cluster resampling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.evaluation.stats import (
    bootstrap_interval,
    holm,
    paired_comparison,
    sign_flip_test,
    with_holm,
)


def clustered(rng: np.random.Generator, k: int, per: int, mean: float, between: float, within: float):
    """k clusters of ``per`` values: a shared cluster effect plus independent noise."""
    effects = rng.normal(0.0, between, size=k)
    values = mean + np.repeat(effects, per) + rng.normal(0.0, within, size=k * per)
    return values, np.repeat(np.arange(k), per)


def test_cluster_bootstrap_covers_the_true_mean_near_nominal():
    rng = np.random.default_rng(1)
    hits = 0
    for rep in range(200):
        values, clusters = clustered(rng, k=48, per=6, mean=0.1, between=0.05, within=0.1)
        ci = bootstrap_interval(values, clusters, resamples=2_000, seed=rep)
        hits += ci.low <= 0.1 <= ci.high
    assert 0.90 <= hits / 200 <= 0.98


def test_naive_bootstrap_undercovers_where_cluster_bootstrap_does_not():
    rng = np.random.default_rng(2)
    naive_hits = cluster_hits = 0
    widths = []
    for rep in range(100):
        values, clusters = clustered(rng, k=40, per=12, mean=0.0, between=0.1, within=0.05)
        c = bootstrap_interval(values, clusters, resamples=1_000, seed=rep)
        n = bootstrap_interval(values, np.arange(values.size), resamples=1_000, seed=rep)
        cluster_hits += c.low <= 0 <= c.high
        naive_hits += n.low <= 0 <= n.high
        widths.append((c.high - c.low) / (n.high - n.low))
    assert np.median(widths) > 2.0  # strong intra-cluster correlation: independent resampling is far too narrow
    assert naive_hits / 100 < 0.75 < 0.88 < cluster_hits / 100


def test_sign_flip_rejects_a_null_at_about_alpha():
    rng = np.random.default_rng(3)
    rejections = 0
    for rep in range(300):
        diffs, clusters = clustered(rng, k=30, per=4, mean=0.0, between=0.05, within=0.1)
        rejections += sign_flip_test(diffs, clusters, resamples=1_000, seed=rep) < 0.05
    assert 0.02 <= rejections / 300 <= 0.09


def test_sign_flip_rejects_a_planted_effect():
    rng = np.random.default_rng(4)
    rejections = 0
    for rep in range(100):
        diffs, clusters = clustered(rng, k=30, per=4, mean=0.05, between=0.05, within=0.1)
        rejections += sign_flip_test(diffs, clusters, resamples=1_000, seed=rep) < 0.05
    assert rejections / 100 > 0.9


def test_exact_sign_flip_with_few_clusters():
    # 4 clusters, all positive: only the all-plus and all-minus patterns reach the observed |sum|: p = 2/16.
    p = sign_flip_test([1.0, 2.0, 3.0, 4.0], [0, 1, 2, 3])
    assert p == pytest.approx(2 / 16)


def test_paired_comparison_matches_the_mean_difference_and_reports_n():
    base = np.array([0.4, 0.5, 0.6, 0.5, 0.3, 0.7])
    treat = base + np.array([0.1, 0.0, 0.2, 0.1, 0.1, 0.1])
    res = paired_comparison(base, treat, ["a", "a", "b", "b", "c", "c"], resamples=500)
    assert res.gain.mean == pytest.approx(0.1)
    assert (res.gain.n, res.gain.clusters) == (6, 3)
    assert res.gain.low <= res.gain.mean <= res.gain.high


def test_bootstrap_is_seeded():
    values, clusters = clustered(np.random.default_rng(5), 20, 3, 0.0, 0.1, 0.1)
    assert bootstrap_interval(values, clusters, seed=7) == bootstrap_interval(values, clusters, seed=7)


def test_bad_input_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_interval([0.1, float("nan")], [0, 1])
    with pytest.raises(ValueError, match="cluster labels"):
        bootstrap_interval([0.1, 0.2], [0])
    with pytest.raises(ValueError, match="pair them"):
        paired_comparison([0.1, 0.2], [0.1], [0, 1])


def test_holm_known_values():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_holm_is_monotone_and_never_below_raw(ps):
    adj = holm(ps)
    assert all(a >= p - 1e-12 and a <= 1.0 for a, p in zip(adj, ps, strict=True))
    order = np.argsort(ps, kind="stable")
    assert all(np.diff(np.asarray(adj)[order]) >= -1e-12)


def test_with_holm_adjusts_across_comparisons():
    base = np.zeros(40)
    clusters = np.repeat(np.arange(20), 2)
    comps = [paired_comparison(base, base + d, clusters, resamples=200) for d in (np.full(40, 0.1), np.full(40, 0.2))]
    adjusted = with_holm(comps)
    assert [c.p_holm for c in adjusted] == pytest.approx(holm([c.p_value for c in comps]))
