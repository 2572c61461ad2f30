"""Length distributions of a workload section (``{dist: fixed | uniform | lognormal, ...}``).

Used by ``workload.prompt`` / ``workload.output`` and by ``workload.sessions`` (turns, user and
answer tokens per turn); :func:`servesim.workloads.build.sample_lengths` draws from them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, PositiveFloat, model_validator

from servesim.inputs.schema import StrictModel
from servesim.workloads.lengths import fixed_lengths, lognormal_lengths, uniform_lengths

if TYPE_CHECKING:
    import numpy as np

MAX_TOKENS = 2**31 - 1
"""Token counts above this are no model's (and would overflow the engine's integer columns)."""
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
"""A positive token count."""


class FixedLength(StrictModel):
    dist: Literal["fixed"]
    value: Tokens


class UniformLength(StrictModel):
    """Integers uniform on [low, high], both inclusive."""

    dist: Literal["uniform"]
    low: Tokens
    high: Tokens

    @model_validator(mode="after")
    def _check(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class LognormalLength(StrictModel):
    """ln(length) ~ Normal(ln median, sigma), rounded, clipped to [min, max]."""

    dist: Literal["lognormal"]
    median: PositiveFloat
    sigma: Annotated[float, Field(ge=0)]
    min: Tokens = 1
    max: Tokens | None = None

    @model_validator(mode="after")
    def _check(self) -> LognormalLength:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


LengthDist = Annotated[FixedLength | UniformLength | LognormalLength, Field(discriminator="dist")]


def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` lengths (int64, >= 1) drawn from ``dist``."""
    if isinstance(dist, FixedLength):
        return fixed_lengths(dist.value, n)
    if isinstance(dist, UniformLength):
        return uniform_lengths(dist.low, dist.high, n, rng)
    assert isinstance(dist, LognormalLength)
    return lognormal_lengths(dist.median, dist.sigma, n, rng, min_tokens=dist.min, max_tokens=dist.max)
