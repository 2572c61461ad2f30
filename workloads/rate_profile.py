"""Time-varying load: a renewal process run on a clock that speeds up and slows down.

A rate profile ``m(t)`` (a multiplier, :mod:`servesim.workloads.profile_config`) turns into
*operational time* ``L(t) = integral of m from 0 to t``. Arrivals are drawn as usual at
``arrival.rate`` (Poisson, gamma with its burstiness, or constant) on the operational clock and
mapped back with ``t = L^-1(u)``. For Poisson this is exactly the non-homogeneous Poisson process
of intensity ``rate x m(t)`` (the time-rescaling theorem); for gamma it keeps the burstiness of
gaps relative to the local rate; constant arrivals are evenly spaced in operational time. The
expected number of arrivals in ``[a, b)`` is ``rate x (L(b) - L(a))``.

A profile is held as a piecewise-linear multiplier on knots (a step is two knots at one time),
so ``L`` is piecewise quadratic and inverted exactly, vectorised over all arrivals. A diurnal
cosine is sampled on ``DIURNAL_KNOTS`` knots per period (every minute of a day): the area under a
chord differs from the cosine's by under 1e-6 of the period's mean.

:func:`warp` applies the same map to a replayed trace's times: the trace's clock becomes the
operational clock, so a trace replays faster where the profile is above 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servesim.errors import ServesimError
from servesim.inputs.files import read_text
from servesim.workloads.arrivals import arrival_times
from servesim.workloads.profile_config import RateProfileConfig

DIURNAL_KNOTS = 1440


@dataclass(frozen=True)
class RateShape:
    """A multiplier over time: the base shape, linear from ``(times[k], values[k])`` to
    ``(times[k + 1], values[k + 1])`` (equal times: a jump), then ``values[-1]`` (or, with
    ``period_s``, the base repeats); times each burst's factor during ``[start, end)``."""

    times: np.ndarray
    values: np.ndarray
    period_s: float | None = None
    bursts: tuple[tuple[float, float, float], ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        if self.times.size == 0 or self.times[0] != 0:
            raise ValueError("a rate shape starts at time 0")

    # ------------------------------------------------------------------ evaluation
    def multiplier(self, t: np.ndarray) -> np.ndarray:
        """``m(t)`` (at a jump, the value after it)."""
        t = np.asarray(t, dtype=np.float64)
        times, values = self.knots(float(t.max()) if t.size else 0.0)
        return _evaluate(times, values, t, after=True)

    def integral(self, t: float) -> float:
        """``L(t)``: the multiplier integrated from 0 to ``t``."""
        times, values = self.knots(t)
        cumulative = _cumulative(times, values)
        if t >= times[-1]:
            return float(cumulative[-1] + (t - times[-1]) * values[-1])
        k = int(np.searchsorted(times, t, side="right") - 1)
        m = float(_evaluate(times, values, np.array([t]), after=False)[0])
        return float(cumulative[k] + (t - times[k]) * (values[k] + m) / 2)

    def inverse(self, u: np.ndarray) -> np.ndarray:
        """``L^-1(u)``: the first time the integral reaches each ``u`` (inf if it never does)."""
        u = np.asarray(u, dtype=np.float64)
        if u.size == 0:
            return u.copy()
        times, values = self._knots_for_area(float(u.max()))
        cumulative = _cumulative(times, values)
        # the segment where the integral first reaches u (a flat, zero-rate stretch is skipped)
        k = np.clip(np.searchsorted(cumulative, u, side="left") - 1, 0, times.size - 1)
        k = np.where(u > cumulative[-1], times.size - 1, k)
        out = np.empty_like(u)
        past = k == times.size - 1
        if past.any():
            last = values[-1]
            extra = u[past] - cumulative[-1]
            out[past] = times[-1] + (extra / last if last > 0 else np.where(extra > 0, np.inf, 0.0))
        inside = ~past
        if inside.any():
            ki = k[inside]
            span = times[ki + 1] - times[ki]
            a = values[ki]
            slope = (values[ki + 1] - a) / np.where(span > 0, span, 1.0)
            r = u[inside] - cumulative[ki]
            # a tau + slope tau^2 / 2 = r, in the form that is stable for slope -> 0 and a -> 0
            root = np.sqrt(np.maximum(a * a + 2.0 * slope * r, 0.0))
            denominator = a + root
            tau = np.where(denominator > 0, 2.0 * r / np.where(denominator > 0, denominator, 1.0), 0.0)
            out[inside] = times[ki] + np.minimum(tau, span)
        return out

    # ------------------------------------------------------------------ knots
    def knots(self, until: float) -> tuple[np.ndarray, np.ndarray]:
        """Explicit knots of the whole shape (base, repeats, bursts) covering ``[0, until]``; past
        the last knot the multiplier is its last value."""
        times, values = self.times, self.values
        horizon = max(until, max((end for _, end, _ in self.bursts), default=0.0))
        if self.period_s is not None:
            repeats = math.floor(horizon / self.period_s) + 1
            times, values = _repeat(times, values, self.period_s, repeats)
        if not self.bursts:
            return times, values
        edges = [t for start, end, _ in self.bursts for t in (start, end)]
        grid = np.unique(np.concatenate([times, edges]))
        before = _evaluate(times, values, grid, after=False) * self._factor(grid, after=False)
        after = _evaluate(times, values, grid, after=True) * self._factor(grid, after=True)
        out_t = np.repeat(grid, 2)
        out_v = np.empty(out_t.size)
        out_v[0::2], out_v[1::2] = before, after
        return out_t[1:], out_v[1:]  # time 0 has no "before"

    def _factor(self, t: np.ndarray, after: bool) -> np.ndarray:
        factor = np.ones(t.size)
        for start, end, multiplier in self.bursts:
            inside = (t >= start) & (t < end) if after else (t > start) & (t <= end)
            factor[inside] *= multiplier
        return factor

    def _knots_for_area(self, area: float) -> tuple[np.ndarray, np.ndarray]:
        """Knots far enough that the integral reaches ``area`` within them or past them at the
        last value (a periodic shape is unrolled until it does)."""
        until = float(self.times[-1])
        while True:
            times, values = self.knots(until)
            if self.period_s is None or _cumulative(times, values)[-1] >= area:
                return times, values
            until = max(2 * until, until + self.period_s)


def shape_of(profile: RateProfileConfig, base_dir: Path | None = None, where: str = "profile") -> RateShape:
    """The :class:`RateShape` of a profile section (a CSV path resolves against ``base_dir``)."""
    period = None
    if profile.diurnal is not None:
        d = profile.diurnal
        times = np.linspace(0.0, d.period_s, DIURNAL_KNOTS + 1)
        values = d.trough + (1 - d.trough) * (1 + np.cos(2 * np.pi * (times - d.peak_s) / d.period_s)) / 2
        period = d.period_s
        label = f"diurnal (period {d.period_s:g} s, peak at {d.peak_s:g} s, trough {d.trough:g})"
    elif profile.points is not None or profile.csv is not None:
        if profile.points is not None:
            pairs = np.asarray(profile.points, dtype=np.float64)
            label = f"profile of {len(pairs)} points"
        else:
            assert profile.csv is not None
            path = Path(profile.csv).expanduser()
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            pairs = _read_csv(path, f"{where}.csv")
            label = f"profile {path.name} ({len(pairs)} points)"
        times, values = pairs[:, 0], pairs[:, 1]
        if profile.interpolate == "step":
            times, values = _steps(times, values)
            label += ", step"
        if times[0] > 0:  # hold the first value from time 0
            times, values = np.concatenate([[0.0], times]), np.concatenate([[values[0]], values])
    else:
        times, values, label = np.array([0.0]), np.array([1.0]), "flat"
    bursts = tuple((b.start_s, b.start_s + b.duration_s, b.multiplier) for b in profile.bursts)
    if bursts:
        label += " + " + ", ".join(f"{b.multiplier:g}x for {b.duration_s:g} s at {b.start_s:g} s"
                                   for b in profile.bursts)
    shape = RateShape(times, values, period, bursts, label)
    if not np.any(shape.knots(0.0)[1] > 0):
        raise ServesimError(where, "the multiplier is 0 everywhere, so nothing would arrive",
                            "give at least one positive multiplier")
    return shape


def shaped_arrival_times(process: str, rate: float, shape: RateShape, rng: np.random.Generator, *,
                         num_requests: int | None, duration_s: float | None,
                         burstiness: float = 1.0) -> np.ndarray:
    """Arrival times of the renewal process at ``rate`` under ``shape`` (module docstring)."""
    horizon = None if duration_s is None else shape.integral(duration_s)
    if horizon is not None and horizon <= 0:
        return np.empty(0)
    operational = arrival_times(process, rate, rng, num_requests=num_requests, duration_s=horizon,
                                burstiness=burstiness)
    times = shape.inverse(operational)
    times = times[np.isfinite(times)]
    if duration_s is not None:
        times = times[times < duration_s]
    return times


def warp(times: np.ndarray, shape: RateShape) -> np.ndarray:
    """A trace's arrival times replayed under ``shape``: the trace's clock runs at ``m(t)``."""
    return shape.inverse(times)


# ---------------------------------------------------------------------------------------- helpers
def _cumulative(times: np.ndarray, values: np.ndarray) -> np.ndarray:
    areas = np.diff(times) * (values[:-1] + values[1:]) / 2
    out = np.zeros(times.size)
    np.cumsum(areas, out=out[1:])
    return out


def _evaluate(times: np.ndarray, values: np.ndarray, t: np.ndarray, after: bool) -> np.ndarray:
    """The piecewise-linear multiplier at ``t``: at a jump, the value after it (``after``) or
    before it; past the last knot, the last value."""
    if after:
        k = np.clip(np.searchsorted(times, t, side="right") - 1, 0, times.size - 1)
    else:
        k = np.clip(np.searchsorted(times, t, side="left") - 1, 0, times.size - 1)
    nxt = np.minimum(k + 1, times.size - 1)
    span = times[nxt] - times[k]
    frac = np.where(span > 0, (t - times[k]) / np.where(span > 0, span, 1.0), 1.0)
    value = values[k] + np.clip(frac, 0.0, 1.0) * (values[nxt] - values[k])
    past = t >= times[-1] if after else t > times[-1]
    return np.where(past, values[-1], value)


def _repeat(times: np.ndarray, values: np.ndarray, period: float,
            repeats: int) -> tuple[np.ndarray, np.ndarray]:
    body_t, body_v = times[:-1], values[:-1]
    t = np.concatenate([body_t + i * period for i in range(repeats)] + [[repeats * period]])
    v = np.concatenate([body_v] * repeats + [[values[-1]]])
    return t, v


def _steps(times: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knots that hold each value until the next point (a jump: two knots at one time)."""
    t = np.repeat(times, 2)[1:]
    v = np.repeat(values, 2)[:-1]
    return t, v


def _read_csv(path: Path, field: str) -> np.ndarray:
    text = read_text(path, field)
    lines = [line.strip() for line in text.splitlines()]
    header = [c.strip() for c in lines[0].split(",")] if lines else []
    if header[:2] != ["time_s", "multiplier"]:
        raise ServesimError(field, f"{path} line 1 is {lines[0] if lines else 'empty'!r}",
                            "start the file with the header time_s,multiplier")
    pairs = []
    previous = -math.inf
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        cells = line.split(",")
        try:
            t, m = float(cells[0]), float(cells[1])
        except (ValueError, IndexError):
            raise ServesimError(field, f"{path} line {number} is not two numbers: {line!r}",
                                "write time_s,multiplier on every line") from None
        if not (math.isfinite(t) and math.isfinite(m)) or t < 0 or m < 0:
            raise ServesimError(field, f"{path} line {number}: times and multipliers must be >= 0",
                                "fix that line")
        if t < previous:
            raise ServesimError(field, f"{path} line {number}: time {t:g} is before the line above",
                                "sort the file by time_s")
        previous = t
        pairs.append((t, m))
    if not pairs:
        raise ServesimError(field, f"{path} has no rows", "give at least one time_s,multiplier row")
    return np.asarray(pairs, dtype=np.float64)
