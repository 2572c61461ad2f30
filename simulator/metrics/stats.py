"""Percentiles as vLLM's ``benchmark_serving`` reports them (NumPy's linear interpolation),
also for weighted samples, so the ITL distribution never needs one entry per token."""

from __future__ import annotations

import numpy as np

PERCENTILES = (50, 90, 95, 99)
STAT_KEYS = ("mean", "p50", "p90", "p95", "p99", "max")


def describe(values: np.ndarray) -> dict[str, float | None]:
    """mean, p50, p90, p95, p99, max of the finite ``values`` (None for each when there are none)."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return dict.fromkeys(STAT_KEYS)
    points = np.percentile(finite, PERCENTILES)
    return {"mean": float(finite.mean()), **{f"p{p}": float(v) for p, v in zip(PERCENTILES, points,
                                                                                 strict=True)},
            "max": float(finite.max())}


def weighted_percentiles(values: np.ndarray, counts: np.ndarray, percentiles: tuple[float, ...]
                         ) -> np.ndarray:
    """``np.percentile(np.repeat(values, counts), percentiles)`` without expanding the repeat.

    With ``N`` samples in all, the linear method reads the sorted samples at rank
    ``q (N - 1) / 100`` and interpolates between the two neighbouring ranks.
    """
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    ends = np.cumsum(counts)  # rank just past each value's run
    total = int(ends[-1])
    ranks = np.asarray(percentiles, dtype=np.float64) / 100.0 * (total - 1)
    low = np.floor(ranks).astype(np.int64)
    high = np.minimum(low + 1, total - 1)
    low_values = values[np.searchsorted(ends, low, side="right")]
    high_values = values[np.searchsorted(ends, high, side="right")]
    return low_values + (ranks - low) * (high_values - low_values)


def describe_weighted(values: np.ndarray, counts: np.ndarray) -> dict[str, float | None]:
    keep = (counts > 0) & np.isfinite(values)
    values, counts = values[keep], counts[keep]
    if values.size == 0:
        return dict.fromkeys(STAT_KEYS)
    points = weighted_percentiles(values, counts, PERCENTILES)
    mean = float(np.dot(values, counts) / counts.sum())
    return {"mean": mean, **{f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)},
            "max": float(values.max())}
