"""Percentiles as vLLM's ``benchmark_serving`` reports them (NumPy's linear interpolation),
also for weighted samples, so the ITL distribution never needs one entry per token."""

from __future__ import annotations

from collections.abc import Iterator

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
    q_arr = np.asarray(q, dtype=float)
    if (method == "linear" and v.size > LEAN_CHUNK
            and (counts is None or np.asarray(counts).dtype.kind in "iu")):
        result = _bucketed_linear(v, None if counts is None else np.asarray(counts).ravel(), q_arr)
        return float(result) if result.ndim == 0 else result
    w = np.ones_like(v) if counts is None else np.asarray(counts, dtype=float).ravel()
    keep = np.isfinite(v) & (w > 0)
    if not keep.all():
        x, merged = merge_weighted(v[keep], w[keep])
    elif _strictly_increasing(v):  # merged already (the vLLM-named ITL figures): merging it again
        x, merged = v, w            # would give the same arrays, through a sort's copies of them
    else:
        x, merged = merge_weighted(v, w)
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


MERGE_CHUNK = 1 << 18
"""Values merged at a time by :func:`merge_weighted` (a long run's millions of ITL pairs are not
sorted in one piece)."""


def merge_weighted(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and the total weight of each.

    Chunk by chunk, each chunk's distinct values merged into those so far: a weight that is a
    count of tokens (a whole number) sums exactly in any order, so this is ``np.unique`` +
    ``np.bincount`` over the whole sample, without its sort's copies of every value (the memory
    is a chunk's and the distinct values', never the sample's)."""
    if values.size == 0:
        return np.empty(0), np.empty(0)
    if values.size <= MERGE_CHUNK or not _whole_numbers(weights):
        x, inverse = np.unique(values, return_inverse=True)
        return x, np.bincount(inverse, weights=weights)
    x, merged = merge_weighted(values[:MERGE_CHUNK], weights[:MERGE_CHUNK])
    for low in range(MERGE_CHUNK, values.size, MERGE_CHUNK):
        x, merged = _merge_sorted(x, merged, *merge_weighted(values[low:low + MERGE_CHUNK],
                                                             weights[low:low + MERGE_CHUNK]))
    return x, merged


def _merge_sorted(x: np.ndarray, weights: np.ndarray, more: np.ndarray, more_weights: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted distinct samples with their total weights (``np.unique`` + ``np.bincount``
    results) as one: a value of ``more`` already in ``x`` adds its weight to that value's (exact
    for whole numbers), the others are inserted in order."""
    at = np.searchsorted(x, more)
    found = at < x.size
    found[found] = x[at[found]] == more[found]
    weights = weights.copy()
    weights[at[found]] += more_weights[found]  # (each value at most once: both samples are distinct)
    new = ~found
    return np.insert(x, at[new], more[new]), np.insert(weights, at[new], more_weights[new])


LEAN_CHUNK = 1 << 18
"""Samples longer than this get :func:`weighted_percentile`'s bucketed path and
:func:`weighted_mean_std`'s chunked sums, a chunk of this many values at a time (a
million-request run's TTFTs and ITL pairs are never copied, converted or sorted whole)."""
EDGE_SAMPLES = 4096
"""About how many buckets :func:`_bucketed_linear` splits a long sample into (by its values)."""


def _finite_chunks(values: np.ndarray, counts: np.ndarray | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(values, float weights) of each chunk of :data:`LEAN_CHUNK`, without the non-finite values
    and the zero weights."""
    for low in range(0, values.size, LEAN_CHUNK):
        v = values[low:low + LEAN_CHUNK]
        w = np.ones(v.size) if counts is None else counts[low:low + LEAN_CHUNK].astype(float)
        keep = np.isfinite(v) & (w > 0)
        yield (v, w) if keep.all() else (v[keep], w[keep])


def _bucketed_linear(values: np.ndarray, counts: np.ndarray | None, q: np.ndarray) -> np.ndarray:
    """:func:`weighted_percentile`'s ``"linear"`` for a long sample with whole-number weights,
    without sorting it: the values are split into about :data:`EDGE_SAMPLES` buckets at edges read
    off a strided sample of them, the buckets' weights summed chunk by chunk (exact: whole numbers),
    and only the buckets holding the ranks asked for are collected and sorted. Each order
    statistic is the same value the sorted sample gives, so the result equals the sorted path's;
    the memory is a chunk's, not the sample's (a million-request run's ITL pairs are millions)."""
    sample = values[:: max(1, values.size // EDGE_SAMPLES)]
    edges = np.unique(sample[np.isfinite(sample)])
    buckets = np.zeros(edges.size + 1)
    for v, w in _finite_chunks(values, counts):
        buckets += np.bincount(np.searchsorted(edges, v, side="right"), weights=w, minlength=buckets.size)
    ends = np.cumsum(buckets)
    total = float(ends[-1]) if ends.size else 0.0
    if total <= 0:
        return np.full(q.shape, np.nan)
    rank = q / 100.0 * (total - 1)
    low = np.floor(rank)
    high = np.minimum(low + 1, total - 1)
    wanted = np.concatenate([low.ravel(), high.ravel()])
    holding = np.searchsorted(ends, wanted, side="right")  # the bucket whose run of ranks holds each
    needed = np.unique(holding)
    picked_v, picked_w, picked_b = [], [], []
    for v, w in _finite_chunks(values, counts):
        bucket = np.searchsorted(edges, v, side="right")
        mine = np.isin(bucket, needed)
        picked_v.append(v[mine])
        picked_w.append(w[mine])
        picked_b.append(bucket[mine])
    v_all, w_all, b_all = (np.concatenate(parts) for parts in (picked_v, picked_w, picked_b))
    order_statistics = np.empty(wanted.size)
    for bucket in needed.tolist():
        x, merged = merge_weighted(v_all[b_all == bucket], w_all[b_all == bucket])
        before = ends[bucket - 1] if bucket else 0.0
        at = holding == bucket
        order_statistics[at] = x[np.searchsorted(np.cumsum(merged), wanted[at] - before, side="right")]
    low_x = order_statistics[: low.size].reshape(low.shape)
    high_x = order_statistics[low.size:].reshape(high.shape)
    return low_x + (rank - low) * (high_x - low_x)


def weighted_mean_std(values: np.ndarray, weights: np.ndarray | None) -> tuple[float, float]:
    """Weighted mean and (population) standard deviation of finite ``values`` with positive
    ``weights`` (None: each value once): ``np.average`` and its square-rooted variance, a chunk of
    :data:`LEAN_CHUNK` at a time for a long sample (the same figures to rounding, without
    whole-sample temporaries)."""
    if values.size <= LEAN_CHUNK:
        mean = float(np.average(values, weights=weights))
        return mean, float(np.sqrt(np.average((values - mean) ** 2, weights=weights)))
    chunks = range(0, values.size, LEAN_CHUNK)

    def weighted_sum(part: np.ndarray, low: int) -> float:
        if weights is None:
            return float(part.sum())
        return float(np.dot(part, weights[low:low + LEAN_CHUNK].astype(float)))

    total = float(values.size) if weights is None else sum(
        float(weights[low:low + LEAN_CHUNK].sum()) for low in chunks)
    mean = sum(weighted_sum(values[low:low + LEAN_CHUNK], low) for low in chunks) / total
    squares = sum(weighted_sum((values[low:low + LEAN_CHUNK] - mean) ** 2, low) for low in chunks)
    return mean, float(np.sqrt(squares / total))


def weighted_average(values: np.ndarray, weights: np.ndarray, divisor: np.ndarray | None = None) -> float:
    """``np.average(values / divisor, weights=weights)``, a chunk of :data:`LEAN_CHUNK` at a time
    for a long sample: a million-request run's steps table is millions of rows, and the whole
    quotient and product would be two float arrays that long (the same figure to rounding)."""
    if values.size <= LEAN_CHUNK:
        return float(np.average(values if divisor is None else values / divisor, weights=weights))
    total = 0.0
    for low in range(0, values.size, LEAN_CHUNK):
        part = values[low:low + LEAN_CHUNK].astype(float)
        if divisor is not None:
            part /= divisor[low:low + LEAN_CHUNK]
        total += float(np.dot(part, weights[low:low + LEAN_CHUNK]))
    return total / float(weights.sum())


def _strictly_increasing(values: np.ndarray) -> bool:
    """Whether ``values`` are sorted and distinct: :func:`merge_weighted` of such values gives them
    back with their weights as they are (each weight summed alone)."""
    return values.size < 2 or bool((values[1:] > values[:-1]).all())


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
    mean = (float(np.dot(values, counts) / counts.sum()) if values.size <= LEAN_CHUNK
            else weighted_mean_std(values, counts)[0])
    return {"mean": mean, **{f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)},
            "max": float(values.max())}


def fmt_seconds(seconds: float | None) -> str:
    """A latency for people: milliseconds below a second, else seconds; "-" when unknown."""
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"
