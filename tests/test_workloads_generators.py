"""Arrival and length generators, checked against theory.

Tolerances are sampling errors, not fudge: for n independent draws the sample mean has standard
error sd/sqrt(n) (CLT), and the sample standard deviation s has, by the delta method, relative
standard error ~ 0.5 * sqrt((kurtosis - 1) / n). Every check allows 6 standard errors (a false
alarm about 1 in 10^9 per check; seeds are fixed anyway, so the tests are deterministic).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from servesim.errors import ServesimError
from servesim.workloads.arrivals import arrival_times, interarrival_gaps
from servesim.workloads.lengths import (
    clipped_lognormal_mean,
    fixed_lengths,
    lognormal_lengths,
    resample_pairs,
    uniform_lengths,
)
from servesim.workloads.presets import PRESETS, fit_lognormal, get_preset

Z = 6.0
N = 200_000


def gamma_cv_tolerance(shape: float, n: int) -> float:
    """6 standard errors of the sample CV of Gamma(shape) gaps (kurtosis 3 + 6/shape)."""
    cv = 1 / math.sqrt(shape)
    kurtosis = 3 + 6 / shape
    rel_sd_of_s = 0.5 * math.sqrt((kurtosis - 1) / n)
    rel_sd_of_mean = cv / math.sqrt(n)
    return Z * cv * math.hypot(rel_sd_of_s, rel_sd_of_mean)


# ------------------------------------------------------------------------------------- arrivals
def test_poisson_mean_gap_and_cv() -> None:
    rate = 8.0
    gaps = np.diff(arrival_times("poisson", rate, np.random.default_rng(1), num_requests=N), prepend=0.0)
    assert gaps.size == N and np.all(gaps > 0)
    assert abs(gaps.mean() - 1 / rate) < Z * (1 / rate) / math.sqrt(N)
    assert abs(gaps.std() / gaps.mean() - 1.0) < gamma_cv_tolerance(1.0, N)


@pytest.mark.parametrize("shape", [0.25, 4.0])
def test_gamma_cv_is_one_over_sqrt_burstiness(shape: float) -> None:
    rate = 4.0
    gaps = interarrival_gaps("gamma", rate, N, np.random.default_rng(2), burstiness=shape)
    cv = 1 / math.sqrt(shape)
    assert abs(gaps.mean() - 1 / rate) < Z * cv * (1 / rate) / math.sqrt(N)
    assert abs(gaps.std() / gaps.mean() - cv) < gamma_cv_tolerance(shape, N)


def test_gamma_burstiness_one_is_poisson_like() -> None:
    gaps = interarrival_gaps("gamma", 2.0, N, np.random.default_rng(3), burstiness=1.0)
    assert abs(gaps.std() / gaps.mean() - 1.0) < gamma_cv_tolerance(1.0, N)


def test_constant_gaps_are_exact_and_first_arrival_is_one_gap() -> None:
    times = arrival_times("constant", 4.0, np.random.default_rng(0), num_requests=1000)
    assert times[0] == 0.25
    assert times[-1] == 250.0  # k / rate computed directly: no accumulated rounding
    np.testing.assert_allclose(np.diff(times), 0.25, rtol=1e-12)


def test_first_arrival_is_the_first_gap() -> None:
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    times = arrival_times("poisson", 3.0, rng_a, num_requests=10)
    np.testing.assert_allclose(times, np.cumsum(interarrival_gaps("poisson", 3.0, 10, rng_b)))
    assert times[0] > 0


def test_duration_gives_a_poisson_count_inside_the_window() -> None:
    rate, duration = 50.0, 400.0
    times = arrival_times("poisson", rate, np.random.default_rng(7), duration_s=duration)
    expected = rate * duration  # Poisson count: variance = mean
    assert abs(times.size - expected) < Z * math.sqrt(expected)
    assert times.max() < duration and np.all(np.diff(times) >= 0)


def test_duration_and_count_together_cap_both() -> None:
    rng = np.random.default_rng(0)
    assert arrival_times("constant", 10.0, rng, duration_s=5.0).size == 49  # 0.1 .. 4.9
    assert arrival_times("constant", 10.0, rng, duration_s=5.0, num_requests=20).size == 20
    times = arrival_times("gamma", 10.0, rng, duration_s=1000.0, num_requests=50, burstiness=0.3)
    assert times.size == 50 and times[-1] < 1000.0


def test_generation_is_vectorised() -> None:
    start = time.perf_counter()
    arrival_times("gamma", 100.0, np.random.default_rng(0), num_requests=100_000, burstiness=0.5)
    lognormal_lengths(1000, 1.0, 100_000, np.random.default_rng(0), max_tokens=8192)
    assert time.perf_counter() - start < 0.5  # milliseconds in practice; loose for slow CI


@pytest.mark.parametrize(("process", "rate", "burstiness", "field"), [
    ("poison", 1.0, 1.0, "arrival.process"), ("poisson", 0.0, 1.0, "arrival.rate"),
    ("gamma", 1.0, 0.0, "arrival.burstiness"), ("poisson", float("nan"), 1.0, "arrival.rate"),
])
def test_bad_arrival_parameters(process: str, rate: float, burstiness: float, field: str) -> None:
    with pytest.raises(ServesimError, match=field):
        arrival_times(process, rate, np.random.default_rng(0), num_requests=3, burstiness=burstiness)


# -------------------------------------------------------------------------------------- lengths
def test_fixed_and_uniform_bounds_inclusive() -> None:
    assert np.all(fixed_lengths(128, 10) == 128)
    values = uniform_lengths(3, 7, N, np.random.default_rng(0))
    assert values.min() == 3 and values.max() == 7
    counts = np.bincount(values, minlength=8)[3:]
    p = 1 / 5  # each of 5 values; binomial sd sqrt(n p (1-p))
    assert np.all(np.abs(counts - N * p) < Z * math.sqrt(N * p * (1 - p)))
    assert np.all(uniform_lengths(9, 9, 5, np.random.default_rng(0)) == 9)
    with pytest.raises(ServesimError, match="low <= high"):
        uniform_lengths(10, 5, 3, np.random.default_rng(0))


def test_lognormal_median_and_mean_match_the_parametrisation() -> None:
    median, sigma = 1000.0, 0.5
    values = lognormal_lengths(median, sigma, N, np.random.default_rng(0))
    mean = median * math.exp(sigma**2 / 2)
    sd = mean * math.sqrt(math.exp(sigma**2) - 1)
    assert abs(values.mean() - mean) < Z * sd / math.sqrt(N) + 0.5  # + rounding to integers
    # sample median: sd = 1 / (2 f(m) sqrt(n)), f(m) = 1 / (m sigma sqrt(2 pi)) for a lognormal
    median_se = median * sigma * math.sqrt(2 * math.pi) / (2 * math.sqrt(N))
    assert abs(np.median(values) - median) < Z * median_se + 0.5
    assert abs(clipped_lognormal_mean(median, sigma) - mean) < 1e-9 * mean


def test_lognormal_clipping_respected_and_clipped_mean_formula() -> None:
    median, sigma, lo, hi = 200.0, 1.2, 50, 1000
    values = lognormal_lengths(median, sigma, N, np.random.default_rng(4), min_tokens=lo, max_tokens=hi)
    assert values.min() == lo and values.max() == hi and values.dtype == np.int64
    expected = clipped_lognormal_mean(median, sigma, lo, hi)
    # bounded in [lo, hi]: sd <= (hi - lo) / 2
    assert abs(values.mean() - expected) < Z * (hi - lo) / 2 / math.sqrt(N) + 0.5
    below = math.erfc(-(math.log(lo) - math.log(median)) / sigma / math.sqrt(2)) / 2
    assert abs(np.mean(values == lo) - below) < Z * math.sqrt(below * (1 - below) / N) + 1e-3


def test_lognormal_rounds_to_at_least_one_token() -> None:
    values = lognormal_lengths(1.0, 2.0, 10_000, np.random.default_rng(0))
    assert values.min() == 1


def test_clipped_mean_degenerate_cases() -> None:
    assert clipped_lognormal_mean(100.0, 0.0, 1, 50) == 50
    assert clipped_lognormal_mean(100.0, 0.0, 200, 500) == 200
    assert clipped_lognormal_mean(100.0, 0.7, 100, 100) == pytest.approx(100.0)


def test_resample_pairs_keep_the_joint_pairs() -> None:
    prompt = np.array([10, 20, 30, 40])
    output = np.array([1, 2, 3, 4])
    p, o = resample_pairs(prompt, output, 10_000, np.random.default_rng(0))
    assert np.all(p == 10 * o)  # each sampled pair is a real row
    assert set(np.unique(p)) == {10, 20, 30, 40}


def test_fit_lognormal_recovers_parameters_and_matches_mean_and_median() -> None:
    values = lognormal_lengths(500.0, 0.8, N, np.random.default_rng(9))
    fit = fit_lognormal(values)
    assert fit.median == np.median(values)
    assert fit.min == values.min() and fit.max == values.max()
    assert fit.mean == pytest.approx(values.mean(), rel=1e-9)
    assert fit.sigma == pytest.approx(0.8, abs=0.02)


def test_fit_lognormal_rejects_left_skewed_lengths() -> None:
    with pytest.raises(ServesimError, match="right-skewed"):
        fit_lognormal(np.array([1, 90, 95, 100, 100]))


# Trace means from /work/shared/data/README.md and the files (see workloads/presets.py).
PRESET_TRACE_MEANS = {"azure-conversation": (1154.70, 211.13), "azure-code": (2047.85, 27.88),
                      "sharegpt": (2340.03, 438.71)}


@pytest.mark.parametrize("name", sorted(PRESET_TRACE_MEANS))
def test_preset_means_match_their_trace(name: str) -> None:
    """Runs without the data: the hard-coded fit reproduces the trace's means within 1.5%."""
    preset = get_preset(name)
    prompt, output = preset.sample(N, np.random.default_rng(0), np.random.default_rng(1))
    trace_prompt, trace_output = PRESET_TRACE_MEANS[name]
    assert prompt.mean() == pytest.approx(trace_prompt, rel=0.015)
    assert output.mean() == pytest.approx(trace_output, rel=0.015)
    assert prompt.min() >= preset.prompt.min and prompt.max() <= preset.prompt.max
    assert np.median(output) == pytest.approx(preset.output.median, rel=0.05, abs=1)


def test_presets_listed_and_unknown_preset_error() -> None:
    assert {"azure-conversation", "azure-code"} <= set(PRESETS)
    with pytest.raises(ServesimError, match="azure-conversation"):
        get_preset("azure")
