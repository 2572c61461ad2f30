"""Synthetic token-length distributions for prompts and outputs.

Each sampler returns ``n`` int64 lengths >= 1, drawn in one vectorised call:

- ``fixed_lengths``: every request the same length (the usual "in 512 / out 128" benchmark).
- ``uniform_lengths``: integers uniform on ``[low, high]``, both ends inclusive.
- ``lognormal_lengths``: parametrised by its **median** (in tokens) and ``sigma``, the standard
  deviation of the underlying normal (of ``ln length``). So ``ln X ~ Normal(ln median, sigma)``,
  and the unclipped mean is ``median * exp(sigma**2 / 2)``. We chose the median over ``mu`` because
  it is in tokens, survives clipping unchanged, and is what one reads off a trace. Samples are
  rounded to the nearest integer, then clipped to ``[min_tokens, max_tokens]``.
- ``resample_pairs``: joint (prompt, output) pairs drawn with replacement from a trace, so the
  correlation between a prompt's length and its answer's length is kept.

``clipped_lognormal_mean`` is the closed form of the mean after clipping; presets use it to fit
their parameters and tests use it to check samples.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from servesim.errors import ServesimError

if TYPE_CHECKING:
    import numpy as np

MAX_DRAWN_TOKENS = 2**31 - 1
"""Where an unbounded lognormal is clipped: beyond any context length (so such a request is
rejected, not served), and within the int64 the engine counts tokens in."""


def fixed_lengths(value: int, n: int) -> np.ndarray:
    import numpy as np

    if value < 1:
        raise ServesimError("value", f"must be >= 1 token, got {value}", "give a positive length")
    return np.full(n, int(value), dtype=np.int64)


def uniform_lengths(low: int, high: int, n: int, rng: np.random.Generator) -> np.ndarray:
    import numpy as np

    if not 1 <= low <= high:
        raise ServesimError("low/high", f"need 1 <= low <= high, got low={low}, high={high}",
                            "give an inclusive range of positive lengths")
    return rng.integers(low, high + 1, size=n, dtype=np.int64)


def lognormal_lengths(median: float, sigma: float, n: int, rng: np.random.Generator, *,
                      min_tokens: int = 1, max_tokens: int | None = None) -> np.ndarray:
    """Rounded lognormal lengths with the given median and log-space sigma, clipped."""
    import numpy as np

    if not median > 0:
        raise ServesimError("median", f"must be > 0 tokens, got {median}", "give the median length")
    if not sigma >= 0:
        raise ServesimError("sigma", f"must be >= 0, got {sigma}", "give the std of ln(length)")
    _check_clip(min_tokens, max_tokens)
    with np.errstate(over="ignore"):  # an absurd sigma overflows to inf, then clipped
        draws = median * np.exp(sigma * rng.standard_normal(n))
    upper = MAX_DRAWN_TOKENS if max_tokens is None else max_tokens
    return np.clip(np.rint(draws), min_tokens, upper).astype(np.int64)


def resample_pairs(prompt_tokens: np.ndarray, output_tokens: np.ndarray, n: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` joint (prompt, output) pairs drawn uniformly with replacement."""
    import numpy as np

    if len(prompt_tokens) == 0:
        raise ServesimError("lengths.trace", "the length source holds no requests",
                            "give a trace with at least one row")
    rows = rng.integers(0, len(prompt_tokens), size=n)
    return (np.asarray(prompt_tokens, dtype=np.int64)[rows],
            np.asarray(output_tokens, dtype=np.int64)[rows])


def clipped_lognormal_mean(median: float, sigma: float, low: float = 0.0,
                           high: float = math.inf) -> float:
    """E[clip(X, low, high)] for ln X ~ Normal(ln median, sigma) (continuous: no rounding).

    E = low P(X<low) + high P(X>high) + E[X; low<X<high], and the last term is
    ``exp(mu + sigma^2/2) [Phi((ln high - mu - sigma^2)/sigma) - Phi((ln low - mu - sigma^2)/sigma)]``.
    """
    mu = math.log(median)
    if sigma == 0:
        return min(max(median, low), high)
    ln_low = math.log(low) if low > 0 else -math.inf
    ln_high = math.log(high) if math.isfinite(high) else math.inf
    below = _phi((ln_low - mu) / sigma)
    above = 1.0 - _phi((ln_high - mu) / sigma)
    inside = math.exp(mu + sigma**2 / 2) * (_phi((ln_high - mu - sigma**2) / sigma)
                                            - _phi((ln_low - mu - sigma**2) / sigma))
    return (low * below if below else 0.0) + (high * above if above else 0.0) + inside


def _phi(z: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _check_clip(min_tokens: int, max_tokens: int | None) -> None:
    if min_tokens < 1:
        raise ServesimError("min", f"must be >= 1 token, got {min_tokens}", "every request has a token")
    if max_tokens is not None and max_tokens < min_tokens:
        raise ServesimError("max", f"{max_tokens} is below min {min_tokens}", "give max >= min")
