"""Summaries of latency distributions: exact statistics of stored values, nearest-rank percentiles
with missing (infinitely late) values, and a log-spaced histogram for the token-level figures that
are too many to keep (a million requests' inter-token latencies)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

PERCENTILES = (50, 90, 99)


def stats_of(values: np.ndarray) -> dict:
    """mean, p50, p90, p99 and max of exact values; None for each when there are none."""
    if len(values) == 0:
        return {"mean": None, "max": None, **{f"p{q}": None for q in PERCENTILES}}
    pct = np.percentile(values, PERCENTILES)
    return {"mean": float(values.mean()), "max": float(values.max()),
            **{f"p{q}": float(v) for q, v in zip(PERCENTILES, pct)}}


def nearest_rank(values: np.ndarray, num_missing: int, q: float) -> Optional[float]:
    """The q-th percentile by nearest rank of `values` plus `num_missing` infinite ones: the smallest
    x with at least q% of all at or below it; None when that is one of the infinite ones."""
    n = len(values) + num_missing
    if n == 0:
        return None
    k = max(1, math.ceil(round(q * n / 100.0, 9)))  # rounding: 99% of 100 is rank 99, not 100
    if k > len(values):
        return None
    return float(np.partition(values, k - 1)[k - 1])


class LogHistogram:
    """Counts of positive values in log-spaced bins from 1 µs to 10^4 s, `bins_per_decade` a decade.

    A percentile is interpolated between the values of neighbouring ranks, as numpy's default
    (linear) method, each rank's value read as its bin's geometric centre; so it is off by at most
    half a bin (0.58 % at 200 bins a decade). Values outside the range go to the end bins; the
    smallest and largest ranks read the exact minimum and maximum seen.
    """

    LOG_MIN, LOG_MAX = -6.0, 4.0

    def __init__(self, bins_per_decade: int = 200):
        self.bins_per_decade = bins_per_decade
        self.num_bins = int((self.LOG_MAX - self.LOG_MIN) * bins_per_decade)
        self.counts = np.zeros(self.num_bins, dtype=np.int64)
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float, count: int = 1) -> None:
        if count <= 0:
            return
        if value > 0:
            i = int((math.log10(value) - self.LOG_MIN) * self.bins_per_decade)
            i = 0 if i < 0 else (self.num_bins - 1 if i >= self.num_bins else i)
        else:
            i = 0
        self.counts[i] += count
        self.count += count
        self.total += value * count
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def add_many(self, values, counts=None) -> None:
        """Add each of `values` once, or `counts[i]` times (vectorized; same binning as `add`)."""
        values = np.asarray(values, dtype=np.float64)
        if counts is not None:
            counts = np.asarray(counts, dtype=np.int64)
            values, counts = values[counts > 0], counts[counts > 0]
        if len(values) == 0:
            return
        with np.errstate(divide="ignore"):
            idx = ((np.log10(values) - self.LOG_MIN) * self.bins_per_decade)
        idx = np.where(values > 0, idx, 0.0)
        idx = np.clip(idx, 0, self.num_bins - 1).astype(np.int64)
        if counts is None:
            self.counts += np.bincount(idx, minlength=self.num_bins)
            self.count += len(values)
            self.total += float(values.sum())
        else:  # float weights are exact for counts below 2**53
            self.counts += np.bincount(idx, weights=counts, minlength=self.num_bins).astype(np.int64)
            self.count += int(counts.sum())
            # Summed exactly (fsum), not with `values @ counts`: BLAS splits a long dot product over
            # its threads, so that sum's last bits depended on the machine's core count, and the
            # idle threads spun on the other core after every call.
            self.total += math.fsum(values * counts)
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))

    def _rank_values(self, ranks: np.ndarray) -> np.ndarray:
        """The (approximate) value of the k-th smallest element (0-based) for each k in `ranks`."""
        bins = np.searchsorted(np.cumsum(self.counts), ranks, side="right")
        centres = np.clip(10.0 ** (self.LOG_MIN + (bins + 0.5) / self.bins_per_decade), self.min, self.max)
        return np.where(ranks <= 0, self.min, np.where(ranks >= self.count - 1, self.max, centres))

    def percentile(self, q: float) -> Optional[float]:
        if self.count == 0:
            return None
        k = q / 100.0 * (self.count - 1)
        lo, hi = self._rank_values(np.array([math.floor(k), math.ceil(k)]))
        return float(lo + (hi - lo) * (k - math.floor(k)))

    def stats(self) -> dict:
        if self.count == 0:
            return stats_of(np.empty(0))
        return {"mean": self.total / self.count, "max": self.max,
                **{f"p{q}": self.percentile(q) for q in PERCENTILES}}
