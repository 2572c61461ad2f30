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
      lengths: {preset: azure-conversation}        # or {trace: sharegpt.json, format: sharegpt}
      output: {dist: fixed, value: 128}            # optional override of one side
      priority: {classes: [0, 1], weights: [0.2, 0.8]}   # optional; lower is served first


    # dist: fixed {value} | uniform {low, high} (inclusive) | lognormal {median, sigma, min, max}

A generated workload may share system prompts (for prefix caching): ``shared_prefix: {tokens: N,
groups: G}`` prepends one of G system prompts of N tokens, drawn uniformly per request, to every
prompt (so prompts are N tokens longer than the lengths above say)::

      shared_prefix: {tokens: 1024, groups: 8}

Arrivals may follow a rate profile over time (``arrival.profile``; a trace's clock:
``trace.rate_profile``, :mod:`servesim.workloads.profile_config`). Instead of independent requests
a generator may produce chat sessions (``sessions:``, :mod:`servesim.workloads.session_config`) or
agentic workflow runs (``workflow:``, :mod:`servesim.workloads.workflow_config`), started by the
arrival process; a Mooncake trace may be replayed as sessions (``trace.sessions: true``).

Relative paths resolve against ``base_dir`` (the YAML's folder) when the workload is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from servesim.errors import ServesimError
from servesim.inputs.schema import OmitsUnsetExtensions, StrictModel, parse_model
from servesim.workloads.length_dists import MAX_TOKENS, LengthDist, Tokens
from servesim.workloads.presets import PRESETS
from servesim.workloads.profile_config import RateProfileConfig
from servesim.workloads.session_config import SessionsConfig
from servesim.workloads.workflow_config import WorkflowConfig

TraceFormat = Literal["csv", "azure", "mooncake", "burstgpt", "vidur-stats", "arxiv", "sharegpt"]
LENGTH_ONLY = ("vidur-stats", "arxiv", "sharegpt")


class TraceConfig(OmitsUnsetExtensions):
    """Replay of a trace file with arrival times (see ``servesim.workloads.traces`` for the formats)."""

    EXTENSIONS = ("sessions", "rate_profile")

    path: Path
    format: TraceFormat
    rate_scale: PositiveFloat = 1.0
    start_s: Annotated[float, Field(ge=0)] | None = None
    end_s: PositiveFloat | None = None
    max_requests: PositiveInt | None = None
    model: str | None = None  # burstgpt only: keep this model's rows
    sessions: bool = Field(False, description="mooncake only: chain requests into sessions by their "
                           "prefix block ids; a turn waits for the answer it follows")
    rate_profile: RateProfileConfig | None = Field(
        None, description="replay faster or slower over time: the trace's clock runs at this "
        "multiplier (applied after rate_scale)")

    @model_validator(mode="after")
    def _check(self) -> TraceConfig:
        if self.sessions and self.format != "mooncake":
            raise ValueError("sessions are found from prefix block ids, which only mooncake traces "
                             "have; remove sessions or use format: mooncake")
        if self.format in LENGTH_ONLY:
            raise ValueError(f"format {self.format} holds lengths only, no arrival times: use it as "
                             f"`lengths: {{trace: {self.path}, format: {self.format}}}` with an `arrival:` "
                             "process instead of `trace:`")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be after start_s ({self.start_s}); "
                             "the window is [start_s, end_s)")
        if self.model is not None and self.format != "burstgpt":
            raise ValueError("model filters burstgpt traces only; remove it")
        return self


MIN_BURSTINESS = 0.01
"""The burstiest gamma process modelled (gap CV 10)."""


class ArrivalConfig(OmitsUnsetExtensions):
    """A renewal arrival process (see ``servesim.workloads.arrivals``)."""

    EXTENSIONS = ("profile",)

    process: Literal["poisson", "gamma", "constant"]
    rate: PositiveFloat
    burstiness: Annotated[float, Field(ge=MIN_BURSTINESS)] | None = None
    """gamma only: CV of gaps = 1/sqrt(burstiness). Below :data:`MIN_BURSTINESS` most gaps
    underflow to exactly 0 s, so the process is no longer the one asked for."""
    profile: RateProfileConfig | None = Field(
        None, description="a multiplier of rate over time (diurnal, points, csv, bursts); "
        "see servesim.workloads.profile_config")

    @model_validator(mode="after")
    def _check(self) -> ArrivalConfig:
        if self.burstiness is not None and self.process != "gamma":
            raise ValueError(f"burstiness applies to process gamma only, not {self.process}; "
                             "remove it or use process: gamma")
        return self


class VllmRandomLengths(StrictModel):
    """``vllm bench serve --dataset-name random``: prompt ``prefix_len`` + an integer uniform on
    ``[floor(input_len (1 - r)), ceil(input_len (1 + r))]``, output uniform on
    ``[max(1, floor(output_len (1 - r))), ceil(output_len (1 + r))]`` with ``r = range_ratio``
    (vLLM's ``RandomDataset.get_sampling_params``). vLLM first subtracts the tokenizer's special
    tokens from ``input_len`` (1 for Llama's BOS); without a tokenizer servesim does not. The
    ``prefix_len`` tokens are one prefix shared by every prompt (prefix caching can hit it)."""

    input_len: PositiveInt = 1024
    output_len: PositiveInt = 128
    range_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.0
    prefix_len: Annotated[int, Field(ge=0)] = 0


class LengthsConfig(OmitsUnsetExtensions):
    """Joint (prompt, output) lengths: a named preset, pairs resampled from a trace or dataset, or
    vLLM bench's random dataset."""

    EXTENSIONS = ("tokenizer", "random")

    preset: str | None = None
    trace: Path | None = None
    format: TraceFormat | None = None
    model: str | None = None  # burstgpt only
    tokenizer: str | None = None  # sharegpt only: a local Hugging Face tokenizer for real counts
    random: VllmRandomLengths | None = None

    @model_validator(mode="after")
    def _check(self) -> LengthsConfig:
        given = [key for key in ("preset", "trace", "random") if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of preset (one of " + ", ".join(PRESETS)
                             + "), trace (a file, with its format) or random (vLLM bench's random dataset)")
        if self.tokenizer is not None and self.format != "sharegpt":
            raise ValueError("tokenizer counts the text of sharegpt JSON; remove it")
        if self.random is not None:
            if self.format is not None or self.model is not None:
                raise ValueError("format and model go with trace, not random")
            return self
        if self.preset is not None:
            if self.preset not in PRESETS:
                raise ValueError(f"unknown preset {self.preset!r}; use one of {', '.join(PRESETS)}")
            if self.format is not None or self.model is not None:
                raise ValueError("format and model go with trace, not preset")
        elif self.format is None:
            raise ValueError("trace needs its format: one of csv, azure, mooncake, burstgpt, vidur-stats, "
                             "arxiv, sharegpt")
        if self.model is not None and self.format != "burstgpt":
            raise ValueError("model filters burstgpt traces only; remove it")
        return self


class PriorityMix(StrictModel):
    """Each request's priority drawn independently: ``classes[i]`` with probability proportional
    to ``weights[i]`` (all equal when omitted). Lower values are served first (vLLM)."""

    classes: Annotated[list[Annotated[int, Field(ge=-2**62, le=2**62)]], Field(min_length=1)]
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


MAX_REQUESTS = 2**40
"""Only keeps the count an integer NumPy can hold; what a run can actually afford is its memory,
checked against this machine before the workload is drawn (:mod:`servesim.pipeline.budget`)."""

class SharedPrefixConfig(StrictModel):
    """``groups`` system prompts of ``tokens`` tokens; each request starts with one of them."""

    tokens: Tokens
    groups: Annotated[int, Field(ge=1, le=MAX_TOKENS)]


_GENERATOR_KEYS = ("arrival", "num_requests", "duration_s", "lengths", "prompt", "output", "priority",
                   "shared_prefix", "sessions", "workflow")


class WorkloadConfig(OmitsUnsetExtensions):
    """Either ``trace`` alone, or ``arrival`` + size + lengths (see the module docstring)."""

    EXTENSIONS = ("sessions", "workflow")

    trace: TraceConfig | None = None
    arrival: ArrivalConfig | None = None
    num_requests: Annotated[int, Field(gt=0, le=MAX_REQUESTS)] | None = None
    """At most :data:`MAX_REQUESTS`; the run checks what this machine's memory holds."""
    duration_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    lengths: LengthsConfig | None = None
    prompt: LengthDist | None = None
    output: LengthDist | None = None
    priority: PriorityMix | None = None
    shared_prefix: SharedPrefixConfig | None = None
    sessions: SessionsConfig | None = None
    workflow: WorkflowConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        generator = [key for key in _GENERATOR_KEYS if getattr(self, key) is not None]
        if self.sessions is not None and self.workflow is not None:
            raise ValueError("give sessions or workflow, not both (run them as two experiments)")
        if self.sessions is not None or self.workflow is not None:
            return self._check_sessions()
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
        if (self.lengths is not None and self.lengths.random is not None and self.lengths.random.prefix_len
                and self.shared_prefix is not None):
            raise ValueError("lengths.random.prefix_len and shared_prefix both put a prefix before every "
                             "prompt; keep one")
        for side in ("prompt", "output"):
            if self.lengths is None and getattr(self, side) is None:
                raise ValueError(f"no {side} lengths: give lengths: {{preset: ...}} or "
                                 f"{side}: {{dist: fixed|uniform|lognormal, ...}}")
        return self

    def _check_sessions(self) -> WorkloadConfig:
        """Sessions (or workflow runs) start by ``arrival`` (and ``duration_s``); each request's
        lengths come from their own section, so the per-request length keys do not apply."""
        kind = "sessions" if self.sessions is not None else "workflow"
        wrong = [key for key in ("trace", "num_requests", "lengths", "prompt", "output")
                 if getattr(self, key) is not None]
        if wrong:
            raise ValueError(f"with {kind}, {', '.join(wrong)} do not apply (lengths come from {kind}; "
                             f"{kind}.count or duration_s bounds the runs); remove them")
        if self.arrival is None:
            raise ValueError(f"{kind} need arrival: {{process, rate}}: when they start")
        section = self.sessions if self.sessions is not None else self.workflow
        assert section is not None
        if section.count is None and self.duration_s is None:
            raise ValueError(f"give {kind}.count, duration_s (runs starting before it), or both")
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
