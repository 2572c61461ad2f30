"""Numeric helpers that turn run outputs into plot-sized series.

A long run has hundreds of thousands of engine steps and token-level distributions with millions of
samples; a report must show their shape without embedding them. These helpers do the reduction
with NumPy only (no plotting), so the run report and the sweep report share one definition of a
CDF, a percentile and a time bin:

* distributions are stored weighted, ``(value, count)``, and are never expanded;
* engine steps are time *intervals*, not instants: a 40 ms prefill step that straddles a bin
  edge contributes to both bins in proportion to its overlap, so binned averages and rates are
  exact integrals of the step timeline rather than samples of it.
"""

from __future__ import annotations

import math

import numpy as np

from servesim.metrics.stats import merge_weighted

FloatArray = np.ndarray


def weighted_cdf(values: np.ndarray, counts: np.ndarray | None = None) -> tuple[FloatArray, FloatArray]:
    """Return ``(x, F)``: the sorted distinct finite values and ``F(x) = P(X <= x)``.

    ``counts`` weights each value (the same value repeated ``count`` times); duplicates are merged.
    NaN values and non-positive counts are dropped, so a latency column with NaN for rejected
    requests can be passed as is.
    """
    v = np.asarray(values, dtype=float).ravel()
    w = np.ones_like(v) if counts is None else np.asarray(counts, dtype=float).ravel()
    if v.shape != w.shape:
        raise ValueError(f"values and counts differ in length: {v.size} vs {w.size}")
    keep = np.isfinite(v) & (w > 0)
    x, merged = merge_weighted(v[keep], w[keep])
    if x.size == 0:
        return x, merged
    cumulative = np.cumsum(merged)
    return x, cumulative / cumulative[-1]


def thin_cdf(x: FloatArray, cdf: FloatArray, max_points: int = 2000) -> tuple[FloatArray, FloatArray]:
    """Keep at most ``max_points`` points of a CDF, dense in the tail.

    Three quarters of the points are spread evenly in probability (the body); the rest sit at
    geometrically spaced ranks from the top, so p99.9 and the maximum stay exact even when
    100,000 distinct values are reduced to 2,000.
    """
    n = x.size
    if n <= max_points:
        return x, cdf
    n_tail = max(max_points // 4, 2)
    n_body = max_points - n_tail
    body = np.searchsorted(cdf, np.linspace(0.0, 1.0, n_body), side="left")
    tail_offsets = np.unique(np.floor(np.geomspace(1, n, n_tail)).astype(np.int64)) - 1
    keep = np.unique(np.concatenate([[0], np.clip(body, 0, n - 1), n - 1 - tail_offsets]))
    return x[keep], cdf[keep]


def nice_width(raw: float) -> float:
    """The smallest "round" width (1, 2, 2.5 or 5 times a power of ten) that is >= ``raw``."""
    if not raw > 0 or not math.isfinite(raw):
        return 1.0
    exponent = math.floor(math.log10(raw))
    for mantissa in (1.0, 2.0, 2.5, 5.0, 10.0):
        width = mantissa * 10.0**exponent
        if width >= raw * (1 - 1e-12):
            return width
    return 10.0 ** (exponent + 1)


def bin_edges(t_start: float, t_end: float, max_bins: int = 2000) -> FloatArray:
    """Edges of at most ``max_bins`` equal time bins of a round width covering ``[t_start, t_end]``."""
    if max_bins < 1:
        raise ValueError("max_bins must be >= 1")
    span = max(float(t_end) - float(t_start), 1e-9)
    width = nice_width(span / max_bins)
    n_bins = min(max(math.ceil(span / width - 1e-9), 1), max_bins)
    edges = float(t_start) + width * np.arange(n_bins + 1, dtype=float)
    edges[-1] = max(edges[-1], float(t_end))  # rounding must never drop the last event
    return edges


def bin_centers(edges: FloatArray) -> FloatArray:
    """Midpoints of the bins."""
    return 0.5 * (edges[:-1] + edges[1:])


def _ramp_sum(points: FloatArray, weights: FloatArray, t: FloatArray) -> FloatArray:
    """``sum over points p <= t of w * (t - p)`` at each ``t``, in O((n + m) log n)."""
    order = np.argsort(points, kind="stable")
    p, w = points[order], weights[order]
    cum_w = np.concatenate([[0.0], np.cumsum(w)])
    cum_wp = np.concatenate([[0.0], np.cumsum(w * p)])
    k = np.searchsorted(p, t, side="right")
    return t * cum_w[k] - cum_wp[k]


def interval_integral(
    start: np.ndarray, duration: np.ndarray, value: np.ndarray, edges: FloatArray
) -> FloatArray:
    """Per-bin integral over time of ``sum_i value_i * [t in interval i]``.

    Interval ``i`` is ``[start_i, start_i + duration_i)``. Intervals may overlap (several replicas)
    and add up. The integral of one interval up to time t is a ramp clipped at its end, i.e. the
    difference of two ramps, so the whole timeline is integrated with two sorted cumulative sums.
    """
    s = np.asarray(start, dtype=float)
    d = np.asarray(duration, dtype=float)
    v = np.asarray(value, dtype=float)
    if s.size == 0:
        return np.zeros(edges.size - 1)
    origin = edges[0]  # shift times near zero so the cumulative sums keep their precision
    s = s - origin
    t = edges - origin
    total = _ramp_sum(s, v, t) - _ramp_sum(s + d, v, t)
    return np.diff(total)


def interval_mean(
    start: np.ndarray, duration: np.ndarray, value: np.ndarray, edges: FloatArray
) -> FloatArray:
    """Time average of the step timeline per bin; time outside every interval counts as 0.

    Right for quantities that are zero when no step runs (batch size); overlapping intervals of
    different replicas add, so this is the total over replicas.
    """
    return interval_integral(start, duration, value, edges) / np.diff(edges)


def interval_covered_mean(
    start: np.ndarray, duration: np.ndarray, value: np.ndarray, edges: FloatArray
) -> FloatArray:
    """Time average over the part of each bin that some interval covers; NaN where none does.

    Right for a level of one replica (KV-cache use) that has no meaning outside its steps.
    """
    covered = interval_integral(start, duration, np.ones(np.size(start)), edges)
    integral = interval_integral(start, duration, value, edges)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(covered > 1e-12 * np.diff(edges), integral / covered, np.nan)


def interval_rate(
    start: np.ndarray, duration: np.ndarray, amount: np.ndarray, edges: FloatArray
) -> FloatArray:
    """Amount per second per bin, each interval's amount spread evenly over its duration.

    A zero-length interval puts its whole amount at its start.
    """
    s = np.asarray(start, dtype=float)
    d = np.asarray(duration, dtype=float)
    a = np.asarray(amount, dtype=float)
    positive = d > 0
    spread = interval_integral(s[positive], d[positive], a[positive] / d[positive], edges)
    instant = np.histogram(s[~positive], bins=edges, weights=a[~positive])[0]
    return (spread + instant) / np.diff(edges)


def event_rate(times: np.ndarray, edges: FloatArray, weights: np.ndarray | None = None) -> FloatArray:
    """Events (or summed weights) per second per bin; NaN times are ignored."""
    t = np.asarray(times, dtype=float)
    keep = np.isfinite(t)
    w = None if weights is None else np.asarray(weights, dtype=float)[keep]
    return np.histogram(t[keep], bins=edges, weights=w)[0] / np.diff(edges)


def bin_max(times: np.ndarray, values: np.ndarray, edges: FloatArray) -> FloatArray:
    """Largest value among the events that fall in each bin; NaN for an empty bin."""
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    idx = np.searchsorted(edges, t, side="right") - 1
    idx[t == edges[-1]] = edges.size - 2  # the last edge is inclusive
    keep = (idx >= 0) & (idx < edges.size - 1) & np.isfinite(v)
    idx, v = idx[keep], v[keep]
    out = np.full(edges.size - 1, np.nan)
    if idx.size == 0:
        return out
    order = np.argsort(idx, kind="stable")
    idx, v = idx[order], v[order]
    first = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    out[idx[first]] = np.maximum.reduceat(v, first)
    return out


def hold_durations(start: np.ndarray, duration: np.ndarray, group: np.ndarray | None = None) -> FloatArray:
    """Stretch each interval to the next interval's start in the same group.

    A level recorded at a step (queue length, KV blocks in use) stays true until the replica's next
    step, including across idle gaps; the last interval of a group keeps its own duration.
    """
    s = np.asarray(start, dtype=float)
    d = np.asarray(duration, dtype=float)
    g = np.zeros(s.size, dtype=np.int64) if group is None else np.asarray(group)
    order = np.lexsort((s, g))
    held = d[order].copy()
    same_group = g[order][1:] == g[order][:-1]
    gap_to_next = s[order][1:] - s[order][:-1]
    held[:-1] = np.where(same_group, gap_to_next, held[:-1])
    out = np.empty_like(held)
    out[order] = held
    return out
