"""The capacity question as one validated document: ``servesim capacity`` flags and YAML files
both become a :class:`CapacityConfig`.

::

    name: llama3-8b-chat
    seed: 0
    model: llama-3-8b
    workload:                       # the experiment's workload schema; its rate is searched
      arrival: {process: poisson, rate: 10}
      num_requests: 1000
      lengths: {preset: azure-conversation}
    slo:
      ttft_s: 2.0                   # per-request limits, as in an experiment's slo:
      tpot_s: 0.05
      percentile: 99                # judged as p99 TTFT <= 2 s and p99 TPOT <= 50 ms ...
      attainment: null              # ... or, if set (e.g. 0.99), >= 99% of requests meet all limits
    engine: vllm-v0                 # the serving engine every candidate runs (its defaults apply)
    candidates:                     # cartesian product: hardware x tp x pp x dp x ep x policy x replicas
      hardware: [h100-sxm-80gb, a100-sxm-80gb]
      tp: [1, 2]
      pp: [1]                       # pipeline stages; dp: data-parallel attention ranks; ep:
      dp: [1]                       #   expert-parallel degree (layouts a model cannot take are
      ep: [1]                       #   listed as infeasible with the reason)
      policy: [continuous]          # names, or {name: ..., knob: ...} mappings
      replicas: [1]
    deployment: {max_num_seqs: 256}   # engine limits shared by every candidate (not tp/replicas)
    precision: {weights: bf16, activations: bf16, kv_cache: bf16}
    router: {name: round_robin}
    search: {replications: 3, precision: 0.05, requests_per_run: null, warmup_fraction: 0.1}
    target_rate: 40                 # optional: size every candidate for 40 requests/s
    prices: {h100-sxm-80gb: 2.5}    # optional USD per GPU-hour, beats the profile's
    decode_context: null            # context of the decode-batch limits (default: workload mean)

Every key is checked, and a mistake is one line naming the key and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    StrictInt,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from servesim.config import EngineConfig, PolicyConfig, PrecisionConfig, RouterConfig, read_yaml_document
from servesim.errors import ServesimError
from servesim.inputs.names import RunName
from servesim.inputs.overrides import apply_overrides
from servesim.inputs.schema import StrictModel, user_error
from servesim.workloads import WorkloadConfig, parse_workload_config


class CapacitySlo(StrictModel):
    """What a rate must meet. Per-request limits (seconds) as in an experiment's ``slo:``; judged
    either as percentile targets (``p<percentile>`` of each metric within its limit) or, with
    ``attainment``, as the fraction of requests meeting every limit (DistServe's SLO attainment)."""

    ttft_s: float | None = Field(None, gt=0)
    tpot_s: float | None = Field(None, gt=0)
    e2e_s: float | None = Field(None, gt=0)
    percentile: float = Field(99.0, gt=0, le=100, description="percentile of the targets")
    attainment: float | None = Field(None, gt=0, le=1,
                                     description="required fraction of requests meeting all limits")

    @model_validator(mode="after")
    def _some_limit(self) -> CapacitySlo:
        if not self.limits():
            raise ValueError("give at least one of ttft_s, tpot_s, e2e_s (seconds)")
        return self

    def limits(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s),
                                  ("e2e_s", self.e2e_s)) if v is not None}

    @property
    def mode(self) -> str:
        return "attainment" if self.attainment is not None else "percentile"

    def describe(self) -> str:
        names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
        parts = [f"{names[k]} <= {_seconds(v)}" for k, v in self.limits().items()]
        if self.attainment is not None:
            return f">= {self.attainment:.1%} of requests within " + " and ".join(parts)
        return " and ".join(f"p{self.percentile:g} {p}" for p in parts)


def _seconds(value: float) -> str:
    return f"{value * 1e3:g} ms" if value < 1 else f"{value:g} s"


class CandidatesConfig(StrictModel):
    """The deployments to compare: every combination of the lists."""

    hardware: list[str] = Field(min_length=1)
    tp: list[int] = Field([1], min_length=1)
    pp: list[int] = Field([1], min_length=1, description="pipeline stages per replica")
    dp: list[int] = Field([1], min_length=1, description="data-parallel attention ranks per replica")
    ep: list[int] = Field([1], min_length=1, description="expert-parallel degree of the MoE layers")
    policy: list[PolicyConfig] = Field([PolicyConfig()], min_length=1)
    replicas: list[int] = Field([1], min_length=1)

    @field_validator("hardware", "tp", "pp", "dp", "ep", "policy", "replicas", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return value if isinstance(value, list) else [value]

    @field_validator("policy", mode="before")
    @classmethod
    def _named(cls, value: Any) -> Any:
        values = value if isinstance(value, list) else [value]  # may run before _listify
        return [{"name": v} if isinstance(v, str) else v for v in values]

    @model_serializer(mode="wrap")
    def _omit_single_layouts(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """pp, dp and ep are written out only when searched, so answers without them read as
        before."""
        data: dict[str, Any] = handler(self)
        for key in ("pp", "dp", "ep"):
            if data.get(key) == [1]:
                data.pop(key)
        return data

    @field_validator("tp", "pp", "dp", "ep", "replicas")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(v < 1 for v in value):
            raise ValueError(f"must be integers >= 1, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"lists a value twice: {value}")
        return value


class SharedDeployment(StrictModel):
    """Engine limits every candidate shares (tp and replicas come from ``candidates``); unset ones
    take the engine's defaults."""

    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    block_size: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=2)
    watermark: float | None = Field(None, ge=0, lt=1)


class SearchConfig(StrictModel):
    """How the highest sustainable rate is searched (see :mod:`servesim.capacity.search`)."""

    replications: int = Field(3, ge=1, le=50, description="seeds simulated per rate")
    precision: float = Field(0.05, gt=0, lt=1, description="stop when (fail - pass) / pass <= this")
    requests_per_run: int | None = Field(
        None, ge=50, description="requests per simulation (default: workload num_requests, else 1000)")
    warmup_fraction: float = Field(0.1, ge=0, lt=0.9,
                                   description="earliest arrivals left out of the SLO metrics")
    max_doublings: int = Field(8, ge=1, le=20, description="bracketing steps above the first guess")
    max_halvings: int = Field(7, ge=1, le=20, description="bracketing steps below the first guess")


class CapacityConfig(StrictModel):
    name: RunName = "capacity"
    seed: StrictInt = Field(0, ge=0, description="first seed; replication k uses seed + k")
    model: str
    workload: WorkloadConfig
    slo: CapacitySlo
    candidates: CandidatesConfig
    engine: EngineConfig = EngineConfig()
    deployment: SharedDeployment = SharedDeployment()
    precision: PrecisionConfig = PrecisionConfig()
    router: RouterConfig = RouterConfig()
    search: SearchConfig = SearchConfig()
    target_rate: float | None = Field(None, gt=0, description="requests/s to size every candidate for")
    prices: dict[str, float] = Field(default_factory=dict, description="USD per GPU-hour by hardware")
    decode_context: int | None = Field(None, ge=1, description="context of the decode-batch limits")

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("prices")
    @classmethod
    def _non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        for name, price in value.items():
            if not price >= 0:
                raise ValueError(f"price of {name} must be >= 0 USD per GPU-hour, got {price}")
        return value

    @property
    def requests_per_run(self) -> int:
        if self.search.requests_per_run is not None:
            return self.search.requests_per_run
        return self.workload.num_requests or 1000


# ---------------------------------------------------------------------- loading
def validate_capacity(document: dict[str, Any], source: str = "capacity config") -> CapacityConfig:
    """Validate a capacity document; the first mistake becomes a one-line ServesimError."""
    if "workload" in document:  # its own parser words workload errors best
        document = {**document, "workload": parse_workload_config(document["workload"])}
    try:
        return CapacityConfig.model_validate(document)
    except ValidationError as exc:
        raise _as_user_error(exc, source) from None


def load_capacity_document(path: str | Path | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The YAML mapping at ``path`` (empty without one) with ``--set`` overrides applied."""
    document = read_yaml_document(Path(path)) if path is not None else {}
    return apply_overrides(document, overrides or [])


_MISSING_HINTS = {"model": "--model NAME", "candidates": "--hardware NAME",
                  "candidates.hardware": "--hardware NAME", "slo": "--ttft/--tpot/--e2e SECONDS",
                  "workload": "a workload: section"}
"""A missing key names the flag that gives it (flags and YAML share this schema)."""


def _missing_fix(field: str, key: str) -> str:
    hint = _MISSING_HINTS.get(field)
    return f"give {hint}" if hint else f"add {key}: ..."


def _as_user_error(exc: ValidationError, source: str) -> ServesimError:
    return user_error(exc, CapacityConfig, missing_fix=_missing_fix, value_fix="fix the value")

