"""Synthetic arrival processes: when requests reach the server.

Three renewal processes, each drawn as one vectorised array of inter-arrival gaps:

- ``poisson``: exponential gaps with mean ``1/rate`` (coefficient of variation 1).
- ``gamma``: gaps ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)), exactly vLLM's
  ``benchmark_serving --burstiness``: the mean gap stays ``1/rate`` while the coefficient of
  variation is ``1/sqrt(burstiness)``; burstiness 1 is Poisson, < 1 is burstier, > 1 smoother.
- ``constant``: every gap is exactly ``1/rate`` (arrival ``k`` at ``k/rate``, computed directly so
  that no rounding accumulates over long runs).

``rate = inf`` (any process) sends every request at t = 0, as ``vllm bench serve`` does by
default. Closed-loop clients (``process: closed``) have no arrival times before the run: see
:mod:`servesim.core.clients`.

First arrival: the process starts at t = 0 and the first request arrives one gap later (at the
first gap), as in the textbook Poisson process on ``[0, T)``. This makes ``duration_s`` exact in
expectation (``rate * duration_s`` requests) and keeps every gap, the first one included, drawn
from the same law. Trace replays instead keep the trace's own timeline (see ``traces.py``).
"""

from __future__ import annotations

import math

import numpy as np

from servesim.errors import ServesimError

ARRIVAL_PROCESSES = ("poisson", "gamma", "constant")
MAX_DRAWS = 2**31
"""The most gaps drawn in one array (a run checks its memory before drawing, see
:mod:`servesim.pipeline.budget`; this only keeps a direct caller from asking NumPy for more)."""


def interarrival_gaps(process: str, rate: float, n: int, rng: np.random.Generator,
                      burstiness: float = 1.0) -> np.ndarray:
    """``n`` gaps in seconds (float64) of the named process at ``rate`` requests/s."""
    _check(process, rate, burstiness)
    if n > MAX_DRAWS:
        raise ServesimError("workload", f"{n:,} arrivals are more than one run can draw",
                            "ask for fewer requests or a shorter duration_s")
    if process == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    if process == "gamma":
        return rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    return np.full(n, 1.0 / rate)


def arrival_times(process: str, rate: float, rng: np.random.Generator, *,
                  num_requests: int | None = None, duration_s: float | None = None,
                  burstiness: float = 1.0) -> np.ndarray:
    """Sorted arrival times (s) of the first ``num_requests`` requests, or of all requests that
    arrive before ``duration_s``, or of at most ``num_requests`` of those when both are given."""
    if rate == math.inf and num_requests is not None:
        _check(process, 1.0, burstiness)
        return np.zeros(num_requests, dtype=np.float64)
    _check(process, rate, burstiness)
    if num_requests is None and duration_s is None:
        raise ServesimError("workload", "needs num_requests or duration_s", "give one or both")
    if num_requests is not None and num_requests < 0:
        raise ServesimError("num_requests", f"must be >= 0, got {num_requests}", "give a count")
    if duration_s is not None and not duration_s > 0:
        raise ServesimError("duration_s", f"must be > 0, got {duration_s}", "give a positive duration")

    if process == "constant":
        if duration_s is None:
            assert num_requests is not None  # checked above: one of the two is given
            n = num_requests
        else:
            n = min(math.ceil(duration_s * rate) + 1, MAX_DRAWS + 1)
            if num_requests is not None:
                n = min(n, num_requests)
        times = np.arange(1, n + 1, dtype=np.float64) / rate
    elif duration_s is None:
        assert num_requests is not None
        with np.errstate(over="ignore"):  # absurdly late arrivals become inf; the table refuses them
            times = np.cumsum(interarrival_gaps(process, rate, num_requests, rng, burstiness))
    else:
        times = _until(process, rate, duration_s, rng, burstiness, num_requests)
    if duration_s is not None:
        times = times[times < duration_s]
    if num_requests is not None:
        times = times[:num_requests]
    return times


def _until(process: str, rate: float, duration_s: float, rng: np.random.Generator,
           burstiness: float, cap: int | None) -> np.ndarray:
    """Arrivals up to ``duration_s`` (and past it by one): draws gaps in large chunks sized from
    the expected count plus ten standard deviations, so one chunk almost always suffices."""
    expected = rate * duration_s
    chunk = int(min(expected + 10.0 * math.sqrt(expected / min(burstiness, 1.0)) + 16, MAX_DRAWS))
    if cap is not None:
        chunk = min(chunk, cap)
    parts: list[np.ndarray] = []
    last = 0.0
    count = 0
    while last < duration_s and (cap is None or count < cap):
        part = last + np.cumsum(interarrival_gaps(process, rate, chunk, rng, burstiness))
        parts.append(part)
        last = float(part[-1])
        count += part.size
    return np.concatenate(parts) if parts else np.empty(0)


def _check(process: str, rate: float, burstiness: float) -> None:
    if process not in ARRIVAL_PROCESSES:
        raise ServesimError("arrival.process", f"unknown process {process!r}",
                            f"use one of {', '.join(ARRIVAL_PROCESSES)}")
    if not (math.isfinite(rate) and rate > 0):
        raise ServesimError("arrival.rate", f"must be a positive number of requests/s, got {rate}",
                            "give e.g. rate: 4.0")
    if not (math.isfinite(burstiness) and burstiness > 0):
        raise ServesimError("arrival.burstiness", f"must be > 0, got {burstiness}",
                            "1 is Poisson, < 1 burstier, > 1 smoother")
