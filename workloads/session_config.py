"""The ``workload.sessions:`` section: multi-turn chat sessions, as a pydantic model.

With ``sessions:``, the workload's ``arrival`` process (and ``duration_s``) say when *sessions*
start, and each session is a chain of turns (:mod:`servesim.workloads.sessions`)::

    workload:
      arrival: {process: poisson, rate: 0.5}      # sessions per second
      duration_s: 3600                            # sessions starting in the first hour
      shared_prefix: {tokens: 400, groups: 4}     # optional system prompt of each session
      sessions:
        count: 2000                               # optional cap on sessions
        turns: {dist: uniform, low: 1, high: 8}   # turns per session
        user_tokens: {dist: lognormal, median: 120, sigma: 1.0}   # new tokens per turn
        first_user_tokens: {dist: fixed, value: 600}              # optional: the opening message
        output: {dist: lognormal, median: 250, sigma: 0.8}        # answer tokens per turn
        think_time_s: {dist: exponential, mean: 20}               # after each answer ends
        max_context_tokens: 16384                 # optional: end a session before it would exceed

Or resample whole conversations (turn count, user tokens and answer tokens of every turn) from a
dataset, keeping ``think_time_s`` from a distribution::

      sessions:
        conversations: {path: ShareGPT_V3_unfiltered_cleaned_split.json, format: sharegpt}
        think_time_s: {dist: lognormal, median: 15, sigma: 1}
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from servesim.inputs.schema import StrictModel
from servesim.workloads.length_dists import LengthDist


class FixedSeconds(StrictModel):
    dist: Literal["fixed"]
    value: Annotated[float, Field(ge=0, allow_inf_nan=False)]


class ExponentialSeconds(StrictModel):
    """Memoryless think times with the given mean (the classic closed-system user model)."""

    dist: Literal["exponential"]
    mean: PositiveFloat


class LognormalSeconds(StrictModel):
    """ln(seconds) ~ Normal(ln median, sigma), optionally capped at ``max``."""

    dist: Literal["lognormal"]
    median: PositiveFloat
    sigma: Annotated[float, Field(ge=0)]
    max: PositiveFloat | None = None


class UniformSeconds(StrictModel):
    dist: Literal["uniform"]
    low: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    high: Annotated[float, Field(ge=0, allow_inf_nan=False)]

    @model_validator(mode="after")
    def _check(self) -> UniformSeconds:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


SecondsDist = Annotated[FixedSeconds | ExponentialSeconds | LognormalSeconds | UniformSeconds,
                        Field(discriminator="dist")]


class ConversationSource(StrictModel):
    """Whole conversations to resample: raw ShareGPT JSON (``format: sharegpt``)."""

    path: Path
    format: Literal["sharegpt"] = "sharegpt"
    tokenizer: str | None = Field(None, description="a local Hugging Face tokenizer for real token "
                                  "counts (default: the ceil(chars / 4) estimate)")


class SessionsConfig(StrictModel):
    """Multi-turn sessions (see the module docstring)."""

    count: PositiveInt | None = Field(None, description="sessions to generate (with duration_s: at most)")
    turns: LengthDist | None = None
    user_tokens: LengthDist | None = None
    first_user_tokens: LengthDist | None = None
    output: LengthDist | None = None
    conversations: ConversationSource | None = None
    think_time_s: SecondsDist
    max_context_tokens: PositiveInt | None = Field(
        None, description="a session ends before a turn whose prompt + output would exceed this")

    @model_validator(mode="after")
    def _check(self) -> SessionsConfig:
        synthetic = [k for k in ("turns", "user_tokens", "first_user_tokens", "output")
                     if getattr(self, k) is not None]
        if self.conversations is not None:
            if synthetic:
                raise ValueError(f"conversations gives every turn's lengths; remove {', '.join(synthetic)}")
            return self
        missing = [k for k in ("turns", "user_tokens", "output") if getattr(self, k) is None]
        if missing:
            raise ValueError(f"give {', '.join(missing)} (distributions), or conversations: {{path, "
                             "format: sharegpt}} to resample whole conversations")
        return self
