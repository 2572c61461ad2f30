"""The ``workload:`` section of an experiment YAML, as a pydantic model.

Two forms, exactly one per workload:

Replay a trace::

    workload:
      trace: {path: traces/conv.csv, format: azure, rate_scale: 2.0, start_s: 0, end_s: 600,
              max_requests: 5000}

Generate requests: an arrival process, a size (``num_requests`` and/or ``duration_s``: with both,
the requests arriving before ``duration_s``, at most ``num_requests``), and lengths, given
jointly by ``lengths:`` (a named preset, or (prompt, output) pairs resampled from a trace of any
format) and/or per side by ``prompt:`` and ``output:`` (which override that side of ``lengths``)::

    workload:
      arrival: {process: gamma, rate: 4.0, burstiness: 0.5}
      num_requests: 1000
      lengths: {preset: azure-conversation}        # or {trace: sharegpt.csv, format: sharegpt}
      output: {dist: fixed, value: 128}            # optional override of one side
      priority: {classes: [0, 1], weights: [0.2, 0.8]}   # optional; lower is served first


    # dist: fixed {value} | uniform {low, high} (inclusive) | lognormal {median, sigma, min, max}

A generated workload may share system prompts (for prefix caching): ``shared_prefix: {tokens: N,
groups: G}`` prepends one of G system prompts of N tokens, drawn uniformly per request, to every
prompt (so prompts are N tokens longer than the lengths above say)::

      shared_prefix: {tokens: 1024, groups: 8}

Relative paths resolve against ``base_dir`` (the YAML's folder) when the workload is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, ValidationInfo, field_validator, model_validator

from servesim.errors import ServesimError
from servesim.inputs.schema import StrictModel, parse_model
from servesim.workloads.presets import PRESETS

TraceFormat = Literal["csv", "azure", "mooncake", "burstgpt", "sharegpt", "arxiv"]


class TraceConfig(StrictModel):
    """Replay of a trace file with arrival times (see ``servesim.workloads.traces`` for the formats)."""

    path: Path
    format: TraceFormat
    rate_scale: PositiveFloat = 1.0
    start_s: Annotated[float, Field(ge=0)] | None = None
    end_s: PositiveFloat | None = None
    max_requests: PositiveInt | None = None
    model: str | None = None  # burstgpt only: keep this model's rows

    @model_validator(mode="after")
    def _check(self) -> TraceConfig:
        if self.format in ("sharegpt", "arxiv"):
            raise ValueError(f"format {self.format} holds lengths only, no arrival times: use it as "
                             f"`lengths: {{trace: {self.path}, format: {self.format}}}` with an `arrival:` "
                             "process instead of `trace:`")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be after start_s ({self.start_s}); "
                             "the window is [start_s, end_s)")
        if self.model is not None and self.format != "burstgpt":
            raise ValueError("model filters burstgpt traces only; remove it")
        return self


class ArrivalConfig(StrictModel):
    """A renewal arrival process (see ``servesim.workloads.arrivals``), or closed-loop clients.

    ``rate: inf`` sends every request at t = 0 (``vllm bench serve``'s default rate).
    ``process: closed`` is ``concurrency`` clients, each sending its next request when its
    previous one completes, after ``think_time_s`` (``vllm bench serve --max-concurrency``,
    ``aiperf --concurrency``); the arrival times are then decided during the run
    (``servesim.core.clients``)."""

    process: Literal["poisson", "gamma", "constant", "closed"]
    rate: Annotated[float, Field(gt=0)] | None = Field(None, validate_default=True)
    burstiness: PositiveFloat | None = None  # gamma only: CV of gaps = 1/sqrt(burstiness)
    concurrency: PositiveInt | None = Field(None, validate_default=True)  # closed only
    think_time_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None  # closed only

    @field_validator("rate", mode="after")
    @classmethod
    def _rate(cls, rate: float | None, info: ValidationInfo) -> float | None:
        process = info.data.get("process")
        if process == "closed":
            if rate is not None:
                raise ValueError("process closed sends a request whenever one completes; remove rate "
                                 "(or use an open process: poisson, gamma, constant)")
        elif process is not None and rate is None:
            raise ValueError(f"is required for process {process}: requests per second (inf: every "
                             "request at t = 0)")
        if rate is not None and rate != rate:
            raise ValueError("must be a number of requests per second, not nan")
        return rate

    @field_validator("concurrency", mode="after")
    @classmethod
    def _concurrency(cls, concurrency: int | None, info: ValidationInfo) -> int | None:
        if info.data.get("process") == "closed" and concurrency is None:
            raise ValueError("is required for process closed: the number of clients, each with one "
                             "request in flight")
        return concurrency

    @model_validator(mode="after")
    def _check(self) -> ArrivalConfig:
        if self.burstiness is not None and self.process != "gamma":
            raise ValueError(f"burstiness applies to process gamma only, not {self.process}; "
                             "remove it or use process: gamma")
        if self.process != "closed":
            for key in ("concurrency", "think_time_s"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} applies to process closed only; remove it or use "
                                     "process: closed")
        return self

    @property
    def is_closed(self) -> bool:
        return self.process == "closed"


class FixedLength(StrictModel):
    dist: Literal["fixed"]
    value: PositiveInt


class UniformLength(StrictModel):
    """Integers uniform on [low, high], both inclusive."""

    dist: Literal["uniform"]
    low: PositiveInt
    high: PositiveInt

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
    min: PositiveInt = 1
    max: PositiveInt | None = None

    @model_validator(mode="after")
    def _check(self) -> LognormalLength:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


LengthDist = Annotated[FixedLength | UniformLength | LognormalLength, Field(discriminator="dist")]


class LengthsConfig(StrictModel):
    """Joint (prompt, output) lengths: a named preset, or pairs resampled from a trace."""

    preset: str | None = None
    trace: Path | None = None
    format: TraceFormat | None = None
    model: str | None = None  # burstgpt only

    @model_validator(mode="after")
    def _check(self) -> LengthsConfig:
        if (self.preset is None) == (self.trace is None):
            raise ValueError("give exactly one of preset (one of " + ", ".join(PRESETS)
                             + ") or trace (a file, with its format)")
        if self.preset is not None:
            if self.preset not in PRESETS:
                raise ValueError(f"unknown preset {self.preset!r}; use one of {', '.join(PRESETS)}")
            if self.format is not None or self.model is not None:
                raise ValueError("format and model go with trace, not preset")
        elif self.format is None:
            raise ValueError("trace needs its format: one of csv, azure, mooncake, burstgpt, sharegpt, arxiv")
        if self.model is not None and self.format != "burstgpt":
            raise ValueError("model filters burstgpt traces only; remove it")
        return self


class PriorityMix(StrictModel):
    """Each request's priority drawn independently: ``classes[i]`` with probability proportional
    to ``weights[i]`` (all equal when omitted). Lower values are served first (vLLM)."""

    classes: Annotated[list[int], Field(min_length=1)]
    weights: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = None

    @model_validator(mode="after")
    def _check(self) -> PriorityMix:
        if len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes {self.classes} repeat a value; list each class once")
        if self.weights is not None:
            if len(self.weights) != len(self.classes):
                raise ValueError(f"{len(self.weights)} weights for {len(self.classes)} classes; "
                                 "give one weight per class")
            if sum(self.weights) <= 0:
                raise ValueError("weights sum to 0; give at least one positive weight")
        return self


MAX_REQUESTS = 100_000_000
"""A generous bound on generated requests (about 5 GB of state): beyond it, split the run."""

class SharedPrefixConfig(StrictModel):
    """``groups`` system prompts of ``tokens`` tokens; each request starts with one of them."""

    tokens: PositiveInt
    groups: PositiveInt


_GENERATOR_KEYS = ("arrival", "num_requests", "duration_s", "lengths", "prompt", "output", "priority",
                   "shared_prefix")


class WorkloadConfig(StrictModel):
    """Either ``trace`` alone, or ``arrival`` + size + lengths (see the module docstring)."""

    trace: TraceConfig | None = None
    arrival: ArrivalConfig | None = None
    num_requests: Annotated[int, Field(gt=0, le=MAX_REQUESTS)] | None = None
    duration_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    lengths: LengthsConfig | None = None
    prompt: LengthDist | None = None
    output: LengthDist | None = None
    priority: PriorityMix | None = None
    shared_prefix: SharedPrefixConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        generator = [key for key in _GENERATOR_KEYS if getattr(self, key) is not None]
        if self.trace is not None:
            if generator:
                raise ValueError(f"trace replays its own arrivals and lengths; remove {', '.join(generator)} "
                                 "(or remove trace to generate requests)")
            return self
        if self.arrival is None:
            raise ValueError("give either trace: {path, format} to replay a trace, or arrival: "
                             "{process, rate} with num_requests and lengths to generate requests")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("a generated workload needs num_requests, duration_s, or both")
        if self.arrival.is_closed and (self.num_requests is None or self.duration_s is not None):
            raise ValueError("closed-loop clients send num_requests requests in all: give num_requests "
                             "(and no duration_s)")
        if self.arrival.rate == float("inf") and self.num_requests is None:
            raise ValueError("rate inf sends every request at t = 0: give num_requests")
        for side in ("prompt", "output"):
            if self.lengths is None and getattr(self, side) is None:
                raise ValueError(f"no {side} lengths: give lengths: {{preset: ...}} or "
                                 f"{side}: {{dist: fixed|uniform|lognormal, ...}}")
        return self

    @property
    def is_trace(self) -> bool:
        return self.trace is not None


def parse_workload_config(data: Any, where: str = "workload") -> WorkloadConfig:
    """Validate the YAML mapping under ``workload:``; errors become one-line ServesimErrors that
    name the key (``workload.arrival.rate``) and what is allowed."""
    if isinstance(data, WorkloadConfig):
        return data
    if not isinstance(data, dict):
        raise ServesimError(where, f"must be a mapping, got {type(data).__name__}",
                            "give trace: {...} or arrival: {...} with num_requests and lengths")
    return parse_model(WorkloadConfig, data, at=where,
                       missing_fix=lambda _, key: f"add {key} (see workloads/config.py for the schema)")
