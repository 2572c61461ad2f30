"""Fitting an engine's runtime coefficients to end-to-end measurements.

A measurement is a schedule (:class:`~servesim.calibration.replay.ScheduleTrace`) and what was
measured of it: the mean TTFT and TPOT of a closed-loop benchmark (one row of a serving file), or
every request of a user's own benchmark run. The fit chooses the engine's CPU time per step
(``fixed_s`` plus ``per_seq_s`` per scheduled sequence, optionally ``per_token_s`` per new token)
and, if asked, one scale per kernel class, to minimise the mean absolute log error of TTFT and
TPOT over all measurements, by coordinate descent over geometric grids that are refined around
the best value (every coefficient stays >= 0; scales stay within 0.25-4). Mechanisms, not
numbers: the same few coefficients must explain every model, GPU and concurrency of an engine,
which :func:`leave_one_model_out` checks by predicting each model from the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from servesim.calibration.replay import KERNEL_CLASSES, Coefficients, ScheduleTrace

GRIDS: dict[str, np.ndarray] = {
    "fixed_s": np.concatenate([[0.0], np.geomspace(1e-5, 2e-2, 40)]),
    "per_seq_s": np.concatenate([[0.0], np.geomspace(1e-7, 5e-4, 40)]),
    "per_token_s": np.concatenate([[0.0], np.geomspace(1e-9, 5e-5, 40)]),
}
SCALE_GRID = np.geomspace(0.25, 4.0, 41)


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

    def predicted(self, c: Coefficients) -> tuple[np.ndarray, np.ndarray]:
        """Predicted TTFT and TPOT comparable with ``ttft_s`` / ``tpot_s`` (means when those
        are one number)."""
        ttft, tpot = self.trace.evaluate(c)
        ttft, tpot = ttft[self.requests], tpot[self.requests]
        if self.ttft_s.size == 1:
            return np.array([np.nanmean(ttft)]), np.array([np.nanmean(tpot)])
        return ttft, tpot


def log_errors(measurements: Sequence[Measurement], c: Coefficients) -> np.ndarray:
    """|ln(predicted / measured)| of every measured value, TTFT and TPOT alike."""
    parts = []
    for m in measurements:
        ttft, tpot = m.predicted(c)
        for predicted, measured in ((ttft, m.ttft_s), (tpot, m.tpot_s)):
            ok = np.isfinite(measured) & np.isfinite(predicted) & (measured > 0) & (predicted > 0)
            parts.append(np.abs(np.log(predicted[ok] / measured[ok])))
    return np.concatenate(parts) if parts else np.empty(0)


def loss(measurements: Sequence[Measurement], c: Coefficients) -> float:
    """Mean absolute log error, each measurement weighted by its number of values... and each
    per-request measurement set counted once as a whole (so one big benchmark run does not drown
    out the rows of a serving file)."""
    total = 0.0
    for m in measurements:
        errors = log_errors([m], c)
        total += float(errors.mean()) if errors.size else 0.0
    return total / max(len(measurements), 1)


def fit(measurements: Sequence[Measurement], params: Sequence[str] = ("fixed_s", "per_seq_s"),
        scale_classes: Sequence[str] = (), start: Coefficients | None = None, rounds: int = 4,
        ) -> Coefficients:
    """Coefficients minimising :func:`loss`: the CPU coefficients in ``params`` and the scales of
    ``scale_classes`` (names from ``KERNEL_CLASSES``); the others stay as in ``start``."""
    best = start or Coefficients()
    objective: Callable[[Coefficients], float] = lambda c: loss(measurements, c)  # noqa: E731
    best_loss = objective(best)
    for refine in range(rounds):
        for name in (*params, *(f"scale:{k}" for k in scale_classes)):
            for value in _candidates(name, best, refine):
                trial = _with(best, name, value)
                value_loss = objective(trial)
                if value_loss < best_loss - 1e-12:
                    best, best_loss = trial, value_loss
    return best


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
    raise ValueError(f"unknown coefficient {name!r}")


def leave_one_model_out(measurements: Sequence[Measurement], params: Sequence[str] = ("fixed_s", "per_seq_s"),
                        ) -> dict[str, Coefficients]:
    """For each group (model), the coefficients fitted on every other group's measurements."""
    groups = sorted({m.group for m in measurements})
    out = {}
    for group in groups:
        others = [m for m in measurements if m.group != group]
        out[group] = fit(others, params) if others else Coefficients()
    return out
