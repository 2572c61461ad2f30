"""Expanding a sweep's axes into its points (see :mod:`servesim.sweep.spec` for the rules).

A point is an ordered mapping ``dotted key -> value``. Axes are built in file order (grid keys,
then zip groups, then the random block) and combined with :func:`itertools.product`, so the last
axis varies fastest and the order of points is a pure function of the file.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from servesim.errors import ServesimError
from servesim.sweep.spec import SweepSpec

Point = dict[str, Any]
Axis = list[Point]
"""One axis: its entries, each a partial point (one key for a grid axis, several for a zip group
or a random sample)."""

RANGE_KINDS = ("uniform", "loguniform", "randint")
MAX_BOUND = 2.0**62
"""Range bounds beyond this (and .inf, .nan, which fail the comparison) are refused: a draw must be
a finite number, and ``randint`` must fit in a 64-bit integer."""


def expand(spec: SweepSpec) -> list[Point]:
    """Every point of the sweep, in order; one empty point when nothing is varied."""
    axes = sweep_axes(spec)
    points = []
    for combination in itertools.product(*axes):
        point: Point = {}
        for part in combination:
            point.update(part)
        points.append(point)
    return points


def sweep_axes(spec: SweepSpec) -> list[Axis]:
    axes: list[Axis] = [[{key: value} for value in values] for key, values in spec.grid.items()]
    for group in spec.zip:
        keys = list(group)
        axes.append([dict(zip(keys, values, strict=True)) for values in zip(*group.values(), strict=True)])
    if spec.random is not None:
        axes.append(random_axis(spec.random.axes, spec.random.n, spec.random.seed))
    return axes


def random_axis(axes: dict[str, Any], n: int, seed: int) -> Axis:
    """``n`` samples, each drawing every key once, in order, from one seeded generator."""
    samplers = {key: _sampler(key, how) for key, how in axes.items()}
    rng = np.random.default_rng(seed)
    return [{key: draw(rng) for key, draw in samplers.items()} for _ in range(n)]


def _sampler(key: str, how: Any) -> Any:
    field = f"random.axes.{key}"
    if isinstance(how, list):
        if not how:
            raise ServesimError(field, "has no values", "list at least one value")
        values = list(how)
        return lambda rng: values[int(rng.integers(len(values)))]
    if not (isinstance(how, dict) and len(how) == 1 and next(iter(how)) in RANGE_KINDS):
        raise ServesimError(field, f"{how!r} is neither a list nor a range",
                            "write a list of values or {uniform: [lo, hi]}, {loguniform: [lo, hi]}, "
                            "{randint: [lo, hi]}")
    kind, bounds = next(iter(how.items()))
    if not (isinstance(bounds, list) and len(bounds) == 2
            and all(isinstance(b, int | float) and not isinstance(b, bool) and abs(b) <= MAX_BOUND
                    for b in bounds)
            and bounds[0] <= bounds[1]):
        raise ServesimError(field, f"{kind} needs [lo, hi] finite numbers with lo <= hi (got {bounds!r})",
                            f"write e.g. {{{kind}: [1, 10]}}")
    lo, hi = bounds
    if kind == "uniform":
        return lambda rng: float(rng.uniform(lo, hi))
    if kind == "loguniform":
        if lo <= 0:
            raise ServesimError(field, f"loguniform needs lo > 0 (got {lo})", "use a positive lower bound")
        return lambda rng: float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    if not all(float(b).is_integer() for b in bounds):
        raise ServesimError(field, f"randint needs integer bounds (got {bounds!r})", "use whole numbers")
    return lambda rng: int(rng.integers(int(lo), int(hi), endpoint=True))


def varied_keys(spec: SweepSpec) -> list[str]:
    """The varied keys in column order (file order)."""
    keys = list(spec.grid)
    for group in spec.zip:
        keys += list(group)
    if spec.random is not None:
        keys += list(spec.random.axes)
    return keys


def point_label(point: Point) -> str:
    """``policy=sjf (predictor=noisy), workload.arrival.rate=16``: values as the reports show them."""
    from servesim.report.format import format_value

    return ", ".join(f"{k}={format_value(v)}" for k, v in point.items()) or "(the base)"
