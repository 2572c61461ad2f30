"""Fitting an engine's runtime coefficients to end-to-end measurements.

A measurement is a schedule (:class:`~servesim.calibration.replay.ScheduleTrace`) and what was
measured of it: the mean TTFT and TPOT of a closed-loop benchmark (one row of a serving file), or
every request of a user's own benchmark run. The fit chooses the engine's CPU time per step
(``fixed_s`` plus ``per_seq_s`` per scheduled sequence, optionally ``per_token_s`` per new token)
and, if asked, one scale per kernel class, to minimise the mean absolute log error of TTFT and
TPOT over all measurements, by coordinate descent over geometric grids that are refined around
the best value, then a Nelder-Mead polish in log space (every coefficient stays >= 0; the grid
keeps scales within 0.25-4). Mechanisms, not
numbers: the same few coefficients must explain every model, GPU and concurrency of an engine,
which :func:`leave_one_model_out` checks by predicting each model from the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from servesim.calibration.replay import KERNEL_CLASSES, Coefficients, ScheduleTrace
from servesim.calibration.stacked_means import StackedMeans

GRIDS: dict[str, np.ndarray] = {
    "fixed_s": np.concatenate([[0.0], np.geomspace(1e-5, 2e-2, 40)]),
    "per_seq_s": np.concatenate([[0.0], np.geomspace(1e-7, 5e-4, 40)]),
    "per_token_s": np.concatenate([[0.0], np.geomspace(1e-9, 5e-5, 40)]),
    "serial_fixed_s": np.concatenate([[0.0], np.geomspace(1e-6, 5e-3, 40)]),
    "serial_per_seq_s": np.concatenate([[0.0], np.geomspace(1e-8, 1e-4, 40)]),
    "frontend_s": np.concatenate([[0.0], np.geomspace(1e-4, 0.5, 60)]),
}
"""Where the coordinate descent looks (seconds). Every coefficient is >= 0; the serial fixed
cost stops at 5 ms per step, above any host work a CUDA-graph engine leaves exposed at batch 1."""
SCALE_GRID = np.geomspace(0.25, 4.0, 41)
UPPER = {name: float(GRIDS[name][-1]) for name in ("serial_fixed_s", "serial_per_seq_s")}
"""Physical bounds the polish keeps too (the grids' largest values)."""


@dataclass(frozen=True)
class Measurement:
    """A trace with what was measured of it: per-request arrays, or one mean per metric (NaN
    where not measured). ``requests`` selects the trace's requests the measurement covers."""

    trace: ScheduleTrace
    requests: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    group: str = ""
    """What it belongs to for leave-one-out (a model)."""
    weights: np.ndarray | None = None
    """Per selected request, its weight in the mean (None: equal), when one number was measured."""
    concurrency: int = 0
    """The closed loop's clients (0: not a fixed concurrency): which measurements are light enough
    to show the front end's latency (:func:`fit_front_end`)."""

    def predicted(self, c: Coefficients) -> tuple[np.ndarray, np.ndarray]:
        """Predicted TTFT and TPOT comparable with ``ttft_s`` / ``tpot_s`` (means when those
        are one number)."""
        ttft, tpot = self.trace.evaluate(c)
        ttft, tpot = ttft[self.requests], tpot[self.requests]
        if self.ttft_s.size == 1:
            w = self.weights
            return np.array([weighted_mean(ttft, w)]), np.array([weighted_mean(tpot, w)])
        return ttft, tpot


def weighted_mean(values: np.ndarray, weights: np.ndarray | None) -> float:
    """Mean of the finite ``values`` (NaN when none), each with its weight."""
    ok = np.isfinite(values)
    if not ok.any():
        return float("nan")
    if weights is None:
        return float(values[ok].mean())
    return float(np.average(values[ok], weights=weights[ok]))


METRICS = ("ttft", "tpot")


def log_errors(measurements: Sequence[Measurement], c: Coefficients,
               metrics: Sequence[str] = METRICS) -> np.ndarray:
    """|ln(predicted / measured)| of every measured value of ``metrics`` (TTFT, TPOT)."""
    parts = []
    for m in measurements:
        ttft, tpot = m.predicted(c)
        pairs = {"ttft": (ttft, m.ttft_s), "tpot": (tpot, m.tpot_s)}
        for predicted, measured in (pairs[k] for k in metrics):
            ok = np.isfinite(measured) & np.isfinite(predicted) & (measured > 0) & (predicted > 0)
            parts.append(np.abs(np.log(predicted[ok] / measured[ok])))
    return np.concatenate(parts) if parts else np.empty(0)


def loss(measurements: Sequence[Measurement], c: Coefficients, metrics: Sequence[str] = METRICS) -> float:
    """Mean absolute log error of ``metrics``, each measurement (a serving row, or a whole
    benchmark run's requests) weighing the same."""
    total = 0.0
    for m in measurements:
        errors = log_errors([m], c, metrics)
        total += float(errors.mean()) if errors.size else 0.0
    return total / max(len(measurements), 1)


def fit(measurements: Sequence[Measurement], params: Sequence[str] = ("fixed_s", "per_seq_s"),
        scale_classes: Sequence[str] = (), start: Coefficients | None = None, rounds: int = 4,
        metrics: Sequence[str] = METRICS) -> Coefficients:
    """Coefficients minimising :func:`loss` of ``metrics``: the CPU coefficients in ``params`` and
    the scales of ``scale_classes`` (names from ``KERNEL_CLASSES``); the others stay as in
    ``start``."""
    best = start or Coefficients()
    stacked = None if scale_classes else StackedMeans.build(measurements, best.scales)
    objective: Callable[[Coefficients], float] = (
        (lambda c: loss(measurements, c, metrics)) if stacked is None
        else (lambda c: stacked.loss(c, metrics)))  # all rows in one pass (same loss, to rounding)
    best_loss = objective(best)
    names = (*params, *(f"scale:{k}" for k in scale_classes))
    for refine in range(rounds):
        for name in names:
            for value in _candidates(name, best, refine):
                trial = _with(best, name, value)
                value_loss = objective(trial)
                if value_loss < best_loss - 1e-12:
                    best, best_loss = trial, value_loss
    return polish(objective, best, names)


def polish(objective: Callable[[Coefficients], float], start: Coefficients, names: Sequence[str],
           iterations: int = 200, tolerance: float = 1e-12) -> Coefficients:
    """Nelder-Mead over the logarithms of the coefficients the grid left above zero: the grid
    finds the basin, this finds its floor when coefficients trade off against each other (a
    fixed cost per step against a cost per sequence)."""
    free = [name for name in names if _get(start, name) > 0]
    if not free:
        return start

    def at(x: np.ndarray) -> Coefficients:
        c = start
        for name, value in zip(free, np.exp(x), strict=True):
            c = _with(c, name, min(float(value), UPPER.get(name, np.inf)))
        return c

    x0 = np.log([_get(start, name) for name in free])
    simplex = [x0] + [x0 + np.eye(len(free))[i] * 0.1 for i in range(len(free))]
    scores = [objective(at(x)) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(scores)
        simplex, scores = [simplex[i] for i in order], [scores[i] for i in order]
        if scores[-1] - scores[0] < tolerance:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        r = objective(at(reflected))
        if r < scores[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            e = objective(at(expanded))
            simplex[-1], scores[-1] = (expanded, e) if e < r else (reflected, r)
        elif r < scores[-2]:
            simplex[-1], scores[-1] = reflected, r
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            c = objective(at(contracted))
            if c < scores[-1]:
                simplex[-1], scores[-1] = contracted, c
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                scores = [scores[0]] + [objective(at(x)) for x in simplex[1:]]
    best = int(np.argmin(scores))
    return at(simplex[best])


def _candidates(name: str, c: Coefficients, refine: int) -> np.ndarray:
    """The grid of ``name`` on the first round; then ever finer steps around its value."""
    current = _get(c, name)
    if refine == 0:
        return SCALE_GRID if name.startswith("scale:") else GRIDS[name]
    span = 2.0 ** (2.0 ** (-refine))
    around = current * np.geomspace(1 / span, span, 9) if current > 0 else GRIDS.get(name, SCALE_GRID)[:4]
    return around


def _get(c: Coefficients, name: str) -> float:
    if name.startswith("scale:"):
        return c.scales[KERNEL_CLASSES.index(name.split(":", 1)[1])]
    return float(getattr(c, name))


def _with(c: Coefficients, name: str, value: float) -> Coefficients:
    if name.startswith("scale:"):
        scales = list(c.scales)
        scales[KERNEL_CLASSES.index(name.split(":", 1)[1])] = float(value)
        return replace(c, scales=tuple(scales))
    if name == "fixed_s":
        return replace(c, fixed_s=float(value))
    if name == "per_seq_s":
        return replace(c, per_seq_s=float(value))
    if name == "per_token_s":
        return replace(c, per_token_s=float(value))
    if name == "serial_fixed_s":
        return replace(c, serial_fixed_s=float(value))
    if name == "serial_per_seq_s":
        return replace(c, serial_per_seq_s=float(value))
    if name == "frontend_s":
        return replace(c, frontend_s=float(value))
    raise ValueError(f"unknown coefficient {name!r}")


FRONT_END_MAX_CONCURRENCY = 16
"""The closed loops whose TTFT the front end's latency is fitted to: at most this many clients.
There a request rarely queues behind others, so what the replay's TTFT misses is mostly the
request's way through the front end; at higher concurrency the miss is dominated by queueing
and prefill scheduling, which the latency must not be bent to absorb."""


def fit_front_end(measurements: Sequence[Measurement], start: Coefficients) -> Coefficients:
    """``start`` with the front end's latency fitted to the re-timed TTFT of the lightly loaded
    measurements (:data:`FRONT_END_MAX_CONCURRENCY`; a user's own run, of unknown concurrency,
    counts as light): a fixed time per request, >= 0, that the step loop does not see. TTFT
    only, since it changes nothing else. (Re-timing is exact for a latency shorter than each
    request's wait for its step; ``calibrate fit-serving`` fits the latency on simulated TTFT
    where it is not: ``serving_validate.front_end_curves``.)"""
    light = [m for m in measurements if m.concurrency <= FRONT_END_MAX_CONCURRENCY]
    if not light:
        return start
    return fit(light, ("frontend_s",), start=start, metrics=("ttft",))


def leave_one_model_out(measurements: Sequence[Measurement], params: Sequence[str] = ("fixed_s", "per_seq_s"),
                        metrics: Sequence[str] = METRICS) -> dict[str, Coefficients]:
    """For each group (model), the coefficients fitted on every other group's measurements."""
    groups = sorted({m.group for m in measurements})
    out = {}
    for group in groups:
        others = [m for m in measurements if m.group != group]
        out[group] = fit(others, params, metrics=metrics) if others else Coefficients()
    return out
