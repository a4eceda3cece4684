"""Calibration of the evaluation statistics at the real suite's shape (96 scenarios x 12 negotiations).

Prints the coverage of the 95% cluster-bootstrap interval (and of a naive per-negotiation bootstrap, for contrast)
and the rejection rate of the cluster sign-flip test under the null and under a planted effect.

    python bench/stats_calibration.py [--reps 400] [--resamples 10000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from nego.evaluation.stats import bootstrap_interval, sign_flip_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--clusters", type=int, default=96)
    parser.add_argument("--per", type=int, default=12)
    args = parser.parse_args()
    rng = np.random.default_rng(2024)
    k, per = args.clusters, args.per
    labels = np.repeat(np.arange(k), per)
    cover = naive = null_rej = effect_rej = 0
    started = time.perf_counter()
    for rep in range(args.reps):
        # skewed, clustered paired differences: a scenario effect plus heavy-tailed noise
        effects = rng.normal(0.0, 0.04, size=k)
        noise = rng.standard_t(4, size=k * per) * 0.08
        diffs = np.repeat(effects, per) + noise
        ci = bootstrap_interval(diffs, labels, resamples=args.resamples, seed=rep)
        cover += ci.low <= 0.0 <= ci.high
        ni = bootstrap_interval(diffs, np.arange(diffs.size), resamples=args.resamples, seed=rep)
        naive += ni.low <= 0.0 <= ni.high
        null_rej += sign_flip_test(diffs, labels, resamples=args.resamples, seed=rep) < 0.05
        effect_rej += sign_flip_test(diffs + 0.02, labels, resamples=args.resamples, seed=rep) < 0.05
    n = args.reps
    took = time.perf_counter() - started
    print(f"{n} replications, {k} clusters x {per}, {args.resamples:,} resamples, {took:.1f} s")
    print(f"cluster bootstrap 95% coverage: {cover / n:.3f}")
    print(f"naive bootstrap 95% coverage:   {naive / n:.3f}")
    print(f"sign-flip size at alpha 0.05:   {null_rej / n:.3f}")
    print(f"sign-flip power, effect +0.02:  {effect_rej / n:.3f}")


if __name__ == "__main__":
    main()
