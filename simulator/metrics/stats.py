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


def weighted_percentile(
    values: np.ndarray, counts: np.ndarray | None, q: float | np.ndarray, method: str = "linear"
) -> float | np.ndarray:
    """Percentile(s) ``q`` (0-100) of a weighted sample, equal to ``np.percentile`` of the expanded
    sample with the same ``method``, computed without expanding it. NaN for an empty sample.

    ``"linear"`` (NumPy's default, and what the engine's summary and vLLM's benchmarks report)
    interpolates between the samples at ranks around ``q (N - 1) / 100``; ``"inverted_cdf"`` is
    the smallest x with ``F(x) >= q/100``, i.e. a point read off the CDF chart.
    """
    v = np.asarray(values, dtype=float).ravel()
    w = np.ones_like(v) if counts is None else np.asarray(counts, dtype=float).ravel()
    keep = np.isfinite(v) & (w > 0)
    x, merged = merge_weighted(v, w) if keep.all() else merge_weighted(v[keep], w[keep])
    q_arr = np.asarray(q, dtype=float)
    if x.size == 0:
        result = np.full(q_arr.shape, np.nan)
    elif method == "inverted_cdf":
        ends = np.cumsum(merged)
        # The tolerance keeps p = k/N on the step where the expanded sample puts it despite rounding.
        idx = np.searchsorted(ends, q_arr / 100.0 * ends[-1] * (1 - 1e-12), side="left")
        result = x[np.clip(idx, 0, x.size - 1)]
    elif method == "linear":
        ends = np.cumsum(merged)  # the rank just past each value's run of copies
        rank = q_arr / 100.0 * (ends[-1] - 1)
        low = np.floor(rank)
        high = np.minimum(low + 1, ends[-1] - 1)
        low_x = x[np.searchsorted(ends, low, side="right")]
        high_x = x[np.searchsorted(ends, high, side="right")]
        result = low_x + (rank - low) * (high_x - low_x)
    else:
        raise ValueError(f"method must be 'linear' or 'inverted_cdf', not {method!r}")
    return float(result) if result.ndim == 0 else result


MERGE_CHUNK = 1 << 20
"""Values merged at a time by :func:`merge_weighted` (a long run's millions of ITL pairs are not
sorted in one piece)."""


def merge_weighted(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and the total weight of each.

    Chunk by chunk, then the chunks' distinct values merged: a weight that is a count of tokens
    (a whole number) sums exactly in any order, so this is ``np.unique`` + ``np.bincount`` over
    the whole sample, without its sort's copies of every value."""
    if values.size == 0:
        return np.empty(0), np.empty(0)
    if values.size <= MERGE_CHUNK or not _whole_numbers(weights):
        x, inverse = np.unique(values, return_inverse=True)
        return x, np.bincount(inverse, weights=weights)
    parts = [merge_weighted(values[low:low + MERGE_CHUNK], weights[low:low + MERGE_CHUNK])
             for low in range(0, values.size, MERGE_CHUNK)]
    x, inverse = np.unique(np.concatenate([part[0] for part in parts]), return_inverse=True)
    return x, np.bincount(inverse, weights=np.concatenate([part[1] for part in parts]))


def _whole_numbers(weights: np.ndarray) -> bool:
    """Whether every weight is a whole number whose sums stay exact in floats (below 2^53)."""
    if weights.dtype.kind in "iu":
        return True
    return bool(np.all(weights == np.floor(weights))) and float(np.abs(weights).sum()) < 2.0**53


def describe_weighted(values: np.ndarray, counts: np.ndarray) -> dict[str, float | None]:
    keep = (counts > 0) & np.isfinite(values)
    if not keep.all():  # (a long run's ITL pairs all count: no copy of them)
        values, counts = values[keep], counts[keep]
    if values.size == 0:
        return dict.fromkeys(STAT_KEYS)
    points = weighted_percentile(values, counts, np.asarray(PERCENTILES, dtype=float))
    assert isinstance(points, np.ndarray)  # an array of q gives an array back
    mean = float(np.dot(values, counts) / counts.sum())
    return {"mean": mean, **{f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)},
            "max": float(values.max())}


def fmt_seconds(seconds: float | None) -> str:
    """A latency for people: milliseconds below a second, else seconds; "-" when unknown."""
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"
