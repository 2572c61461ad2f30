"""The summary's weighted statistics on long samples (issue #18: a million-request run's ITL
pairs): the bucketed percentile and the chunked mean / std give the figures of the sorted,
whole-sample computation, which is itself NumPy's on the expanded sample."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.metrics import stats
from servesim.metrics.stats import weighted_mean_std, weighted_percentile

QS = np.array([0.0, 1.0, 25.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0])


def _sample(seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    # Heavy ties (rounded values) and a long tail, like inter-token gaps; a few NaNs and zero counts.
    values = np.round(rng.lognormal(-3.5, 0.6, size), 5)
    values[rng.integers(0, size, 5)] = np.nan
    counts = rng.integers(0, 40, size).astype(np.int32)
    return values, counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bucketed_percentiles_equal_the_sorted_ones(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    values, counts = _sample(seed, 30_000)
    sorted_path = weighted_percentile(values, counts.astype(float), QS)  # float weights: the sorted path
    monkeypatch.setattr(stats, "LEAN_CHUNK", 4096)  # so 30,000 values take the bucketed path
    monkeypatch.setattr(stats, "EDGE_SAMPLES", 64)
    bucketed = weighted_percentile(values, counts, QS)
    assert np.array_equal(bucketed, sorted_path)
    finite = np.isfinite(values)
    expanded = np.repeat(values[finite], counts[finite])
    assert np.allclose(bucketed, np.percentile(expanded, QS), rtol=0, atol=1e-15)


def test_bucketed_percentiles_of_a_constant_or_empty_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "LEAN_CHUNK", 100)
    assert np.array_equal(weighted_percentile(np.full(1000, 0.02), np.ones(1000, dtype=np.int64), QS),
                          np.full(QS.shape, 0.02))
    assert np.isnan(weighted_percentile(np.full(1000, np.nan), None, 50.0))
    assert weighted_percentile(np.arange(1000.0), None, 50.0) == np.percentile(np.arange(1000.0), 50.0)


def test_chunked_mean_and_std_match_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    values, counts = _sample(3, 50_000)
    keep = np.isfinite(values) & (counts > 0)
    values, counts = values[keep], counts[keep]
    whole = weighted_mean_std(values, counts)
    monkeypatch.setattr(stats, "LEAN_CHUNK", 4096)
    chunked = weighted_mean_std(values, counts)
    expanded = np.repeat(values, counts)
    assert chunked == pytest.approx((expanded.mean(), expanded.std()), rel=1e-12)
    assert chunked == pytest.approx(whole, rel=1e-12)


def test_unweighted_mean_and_std_match_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.random.default_rng(4).lognormal(-2.0, 1.0, 20_000)
    assert weighted_mean_std(values, None) == (values.mean(), values.std())
    monkeypatch.setattr(stats, "LEAN_CHUNK", 4096)
    assert weighted_mean_std(values, None) == pytest.approx((values.mean(), values.std()), rel=1e-12)


def test_chunked_weighted_average_matches_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The KV use and batch size means of a long steps table (time-weighted)."""
    rng = np.random.default_rng(5)
    used = rng.integers(0, 30_000, 20_000).astype(np.int16)
    total = np.full(used.size, 30_000, dtype=np.int16)
    seconds = rng.uniform(0.005, 0.05, used.size)
    expected = np.average(used / total, weights=seconds)
    assert stats.weighted_average(used, seconds, total) == expected
    monkeypatch.setattr(stats, "LEAN_CHUNK", 4096)
    assert stats.weighted_average(used, seconds, total) == pytest.approx(expected, rel=1e-12)
    mean_used = np.average(used, weights=seconds)
    assert stats.weighted_average(used, seconds) == pytest.approx(mean_used, rel=1e-12)
