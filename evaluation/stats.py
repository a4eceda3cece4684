"""Paired statistics for comparing seller arms on identical negotiations.

Negotiations of one scenario (its openers and seeds) are not independent, so every interval and test here
resamples or flips whole clusters (scenarios), never single negotiations. Nothing relies on a normal
approximation: intervals are percentile bootstrap intervals and p-values come from sign-flip permutations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 10_000
EXACT_FLIP_MAX_CLUSTERS = 12
"""Up to this many clusters the sign-flip test enumerates all 2^k sign patterns instead of sampling."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean with a cluster-bootstrap percentile interval, and the sample it came from."""

    mean: float
    low: float
    high: float
    n: int
    clusters: int
    level: float = 0.95


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """The paired difference ``treatment - base`` over identical negotiations.

    ``p_value`` is the two-sided cluster sign-flip p-value; ``p_holm`` is the same after Holm correction across
    the comparisons reported together (equal to ``p_value`` when only one is made).
    """

    gain: Interval
    p_value: float
    p_holm: float


def _cluster_codes(clusters: Sequence[object] | np.ndarray) -> tuple[np.ndarray, int]:
    _, codes = np.unique(np.asarray(clusters), return_inverse=True)
    return codes.ravel(), int(codes.max()) + 1 if codes.size else 0


def _cluster_sums(values: np.ndarray, clusters: Sequence[object] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"need a non-empty 1-d array of values, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError("values contain NaN or infinity: drop or fill them before computing statistics")
    codes, k = _cluster_codes(clusters)
    if codes.size != values.size:
        raise ValueError(f"{values.size} values but {codes.size} cluster labels: give one label per value")
    sums = np.bincount(codes, weights=values, minlength=k)
    sizes = np.bincount(codes, minlength=k).astype(np.float64)
    return sums, sizes


def bootstrap_interval(
    values: Sequence[float] | np.ndarray,
    clusters: Sequence[object] | np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Mean of ``values`` with a percentile interval from a cluster bootstrap.

    Each resample draws whole clusters with replacement and takes the ratio of their summed values to their summed
    sizes, so the estimate matches the plain mean and clusters of unequal size are weighted as in the data.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    sums, sizes = _cluster_sums(np.asarray(values, dtype=np.float64), clusters)
    k = sums.size
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, k, size=(resamples, k))
    means = sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return Interval(float(sums.sum() / sizes.sum()), float(low), float(high), int(sizes.sum()), k, level)


def sign_flip_test(
    differences: Sequence[float] | np.ndarray,
    clusters: Sequence[object] | np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> float:
    """Two-sided p-value for "the mean paired difference is zero", flipping the sign of whole clusters.

    Under the null each cluster's summed difference is symmetric about zero. With few clusters every sign pattern
    is enumerated (an exact test); otherwise ``resamples`` random patterns are drawn and the p-value is
    ``(1 + #{|T*| >= |T|}) / (1 + resamples)``, which never reports zero.
    """
    sums, _ = _cluster_sums(np.asarray(differences, dtype=np.float64), clusters)
    k = sums.size
    observed = abs(sums.sum())
    tol = 1e-12 * max(1.0, float(np.abs(sums).sum()))
    if k <= EXACT_FLIP_MAX_CLUSTERS:
        patterns = ((np.arange(2**k)[:, None] >> np.arange(k)) & 1) * 2 - 1
        stats = np.abs(patterns @ sums)
        return float(np.mean(stats >= observed - tol))
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, resamples, 2_000):
        m = min(2_000, resamples - start)
        signs = rng.integers(0, 2, size=(m, k), dtype=np.int8) * 2 - 1
        hits += int(np.count_nonzero(np.abs(signs @ sums) >= observed - tol))
    return (1 + hits) / (1 + resamples)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (family-wise error control), in the input order."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.size == 0:
        return []
    if np.any((p < 0) | (p > 1) | ~np.isfinite(p)):
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}")
    order = np.argsort(p, kind="stable")
    m = p.size
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted.tolist()


def paired_comparison(
    base: Sequence[float] | np.ndarray,
    treatment: Sequence[float] | np.ndarray,
    clusters: Sequence[object] | np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> PairedComparison:
    """Gain of ``treatment`` over ``base`` where element i of both is the same negotiation."""
    b = np.asarray(base, dtype=np.float64)
    t = np.asarray(treatment, dtype=np.float64)
    if b.shape != t.shape:
        raise ValueError(f"paired arrays differ in length ({b.size} vs {t.size}): pair them on negotiation id first")
    diff = t - b
    gain = bootstrap_interval(diff, clusters, resamples=resamples, seed=seed, level=level)
    p = sign_flip_test(diff, clusters, resamples=resamples, seed=seed + 1)
    return PairedComparison(gain, p, p)


def with_holm(comparisons: Sequence[PairedComparison]) -> list[PairedComparison]:
    """The same comparisons with ``p_holm`` adjusted across all of them."""
    adjusted = holm([c.p_value for c in comparisons])
    return [PairedComparison(c.gain, c.p_value, a) for c, a in zip(comparisons, adjusted, strict=True)]
