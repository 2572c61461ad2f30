"""The summary's statistics over a long run's millions of ITL pairs, merged chunk by chunk (issue
#18's memory): the same floats as one ``np.unique`` + ``np.bincount`` over the whole sample."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.metrics import stats
from servesim.metrics.stats import describe_weighted, merge_weighted, weighted_percentile


def whole(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x, inverse = np.unique(values, return_inverse=True)
    return x, np.bincount(inverse, weights=weights)


def test_chunked_merge_is_the_whole_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    values = rng.choice(rng.uniform(0.005, 0.2, 700), size=20_000)  # gaps repeat, as step times do
    counts = rng.integers(1, 256, size=values.size).astype(float)
    expected = whole(values, counts)
    q = np.array([0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0])
    percentiles = weighted_percentile(values, counts, q)
    summary = describe_weighted(values, counts)
    for chunk in (997, 64):
        monkeypatch.setattr(stats, "MERGE_CHUNK", chunk)
        x, merged = merge_weighted(values, counts)
        assert x.tobytes() == expected[0].tobytes() and merged.tobytes() == expected[1].tobytes()
        assert weighted_percentile(values, counts, q).tobytes() == percentiles.tobytes()
        assert describe_weighted(values, counts) == summary
    assert expected[1].sum() == counts.sum() and expected[0].size == np.unique(values).size


def test_fractional_weights_merge_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights that are not whole numbers could round differently in chunks: merged in one piece."""
    monkeypatch.setattr(stats, "MERGE_CHUNK", 10)
    rng = np.random.default_rng(5)
    values = rng.choice([0.1, 0.2, 0.3], size=500)
    weights = rng.uniform(0.0, 1.0, size=500)
    _, merged = merge_weighted(values, weights)
    assert merged.tobytes() == whole(values, weights)[1].tobytes()
    assert not stats._whole_numbers(weights) and stats._whole_numbers(np.array([1.0, 7.0]))


def test_integer_counts_merge_as_float_counts_and_a_merged_sample_is_read_as_it_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The vLLM-named ITL figures merge the pairs with their int counts (no float copy) and read
    the merged sample's percentiles without merging it again: the same floats either way."""
    rng = np.random.default_rng(6)
    values = rng.choice(rng.uniform(0.005, 0.2, 900), size=30_000)
    counts = rng.integers(1, 256, size=values.size)
    monkeypatch.setattr(stats, "MERGE_CHUNK", 1000)
    x, merged = merge_weighted(values, counts)
    x_float, merged_float = merge_weighted(values, counts.astype(float))
    assert x.tobytes() == x_float.tobytes() and merged.tobytes() == merged_float.tobytes()
    q = np.array([0.0, 50.0, 99.0, 100.0])
    merged_again: list[bool] = []
    real = stats.merge_weighted
    monkeypatch.setattr(stats, "merge_weighted",
                        lambda v, w: merged_again.append(np.shares_memory(v, x)) or real(v, w))
    expected = weighted_percentile(values, counts.astype(float), q)
    assert merged_again and not any(merged_again)
    assert weighted_percentile(x, merged, q).tobytes() == expected.tobytes()
    assert not any(merged_again)  # the merged sample is read as it is
