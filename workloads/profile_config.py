"""The ``profile:`` of a time-varying load, as a pydantic model.

A profile is a *multiplier* of the rate over simulated time: ``arrival.rate x profile(t)`` is the
rate at time ``t`` (so ``rate`` is the rate at multiplier 1, e.g. the peak of a diurnal shape, and
with ``rate: 1`` a profile's values are requests per second). Exactly one shape, optionally with
bursts on top::

    profile: {diurnal: {period_s: 86400, peak_s: 50400, trough: 0.2}}     # cosine, peak at 14:00
    profile: {points: [[0, 0.2], [21600, 1.0], [64800, 1.0], [86400, 0.2]], interpolate: linear}
    profile: {csv: rates.csv, interpolate: step}    # columns time_s,multiplier
    profile: {bursts: [{start_s: 3600, duration_s: 300, multiplier: 3}]}   # flat 1, a 3x burst

Past its last point a ``points``/``csv`` profile holds its last value; a diurnal one repeats.
The same section rescales a trace replay over time (``trace.rate_profile``).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, model_validator

from servesim.inputs.schema import StrictModel

NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class DiurnalShape(StrictModel):
    """``trough + (1 - trough) (1 + cos(2 pi (t - peak_s) / period_s)) / 2``: 1 at ``peak_s``,
    ``trough`` half a period later."""

    period_s: PositiveFloat = 86_400.0
    peak_s: NonNegative = 50_400.0
    trough: Annotated[float, Field(ge=0, le=1)] = 0.2


class Burst(StrictModel):
    """The multiplier is scaled by ``multiplier`` during ``[start_s, start_s + duration_s)``."""

    start_s: NonNegative
    duration_s: PositiveFloat
    multiplier: NonNegative


class RateProfileConfig(StrictModel):
    """A load shape over time (see the module docstring)."""

    diurnal: DiurnalShape | None = None
    points: list[tuple[NonNegative, NonNegative]] | None = Field(
        None, description="[time_s, multiplier] pairs, times increasing (equal times make a jump)")
    csv: Path | None = Field(None, description="a CSV file with columns time_s,multiplier")
    interpolate: Literal["linear", "step"] = Field(
        "linear", description="between points: a straight line, or hold each value until the next")
    bursts: list[Burst] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> RateProfileConfig:
        shapes = [k for k in ("diurnal", "points", "csv") if getattr(self, k) is not None]
        if len(shapes) > 1:
            raise ValueError(f"give one shape, not {' and '.join(shapes)} (bursts go on top of any)")
        if not shapes and not self.bursts:
            raise ValueError("give a shape (diurnal, points or csv) or bursts")
        if self.points is not None:
            if not self.points:
                raise ValueError("points is empty; give [time_s, multiplier] pairs")
            times = [t for t, _ in self.points]
            if any(b < a for a, b in itertools.pairwise(times)):
                raise ValueError("points must be in time order")
        if self.diurnal is not None and self.interpolate != "linear":
            raise ValueError("interpolate applies to points and csv; remove it")
        return self
