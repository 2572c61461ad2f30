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
      ttft_s: 2.0                   # per-request limits, as in an experiment's slo: (seconds, or
      tpot_s: 50ms                  #   with a unit; tpot_ms: 50 is the same)
      percentile: 99                # judged as p99 TTFT <= 2 s and p99 TPOT <= 50 ms ...
      attainment: null              # ... or, if set (e.g. 0.99), >= 99% of requests meet all limits
    engine: vllm-v0                 # the serving engine every candidate runs (its defaults apply)
    candidates:                     # every combination of hardware, tp, pp, dp, ep, policy, replicas|splits
      hardware: [h100-sxm-80gb, a100-sxm-80gb]
      tp: [1, 2]
      pp: [1]                       # pipeline stages; dp: data-parallel attention ranks; ep:
      dp: [1]                       #   expert-parallel degree (layouts a model cannot take are
      ep: [1]                       #   listed as infeasible with the reason)
      policy: [continuous]          # names, or {name: ..., knob: ...} mappings
      replicas: [1]                 # colocated: replicas per replica set
      kind: [colocated]             # add disaggregated to rank prefill/decode splits beside them
      splits: ["1:1"]               # disaggregated: prefill:decode replicas per replica set
      link: {kind: infiniband}      # disaggregated: the KV link (deployment.link's keys)
    deployment: {max_num_seqs: 256}   # engine limits shared by every candidate (not tp/replicas)
    precision: {weights: bf16, activations: bf16, kv_cache: bf16}
    router: {name: round_robin}
    search: {replications: 3, precision: 0.05, requests_per_run: null, warmup_fraction: 0.1,
             early_stop: true, saturation_stop: false}   # see capacity.probe and capacity.saturation
    target_rate: 40                 # optional: size every candidate for 40 requests/s, or ...
    gpu_budget: null                # ... optional: the best deployment on exactly this many GPUs
    prices: {h100-sxm-80gb: 2.5}    # optional USD per GPU-hour, beats the profile's
    decode_context: null            # context of the decode-batch limits (default: workload mean)

Every key is checked, and a mistake is one line naming the key and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

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
from servesim.inputs.slo import SloLimits
from servesim.topology.keys import LinkKeys
from servesim.workloads import WorkloadConfig, parse_workload_config

TOPOLOGY_KINDS = ("colocated", "disaggregated")


class CapacitySlo(SloLimits):
    """What a rate must meet. Per-request limits as in an experiment's ``slo:`` (seconds, any unit
    on input); judged either as percentile targets (``p<percentile>`` of each metric within its
    limit) or, with ``attainment``, as the fraction of requests meeting every limit (DistServe's
    SLO attainment)."""

    percentile: float = Field(99.0, gt=0, le=100, description="percentile of the targets")
    attainment: float | None = Field(None, gt=0, le=1,
                                     description="required fraction of requests meeting all limits")

    @model_validator(mode="after")
    def _some_limit(self) -> CapacitySlo:
        if not self.limits():
            raise ValueError("give at least one of ttft_s, tpot_s, e2e_s (seconds; or their _ms keys)")
        return self

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


Split = tuple[int, int]
"""A disaggregated replica set: (prefill replicas, decode replicas)."""


def parse_split(value: Any) -> Split:
    """``"3:1"``, ``[3, 1]`` or ``{prefill: 3, decode: 1}`` -> (3, 1)."""
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
            return int(parts[0]), int(parts[1])
    elif isinstance(value, list | tuple) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return int(value[0]), int(value[1])
    elif isinstance(value, dict) and set(value) == {"prefill", "decode"}:
        return parse_split([value["prefill"], value["decode"]])
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 60:
        raise ValueError(f"{value} is a number: unquoted, YAML reads a split such as 3:1 as a base-60 "
                         "number; quote it (\"3:1\")")
    raise ValueError(f"{value!r} is not a prefill:decode split; write e.g. \"3:1\" (3 prefill replicas "
                     "for each decode replica)")


class CandidatesConfig(StrictModel):
    """The deployments to compare: every combination of hardware, tp, pp, dp, ep and policy, each
    as the colocated replica sets of ``replicas`` and, with ``kind`` listing ``disaggregated``, as the
    prefill:decode ``splits`` joined by ``link`` (one ranking holds both)."""

    hardware: list[str] = Field(min_length=1)
    tp: list[int] = Field([1], min_length=1)
    pp: list[int] = Field([1], min_length=1, description="pipeline stages per replica")
    dp: list[int] = Field([1], min_length=1, description="data-parallel attention ranks per replica")
    ep: list[int] = Field([1], min_length=1, description="expert-parallel degree of the MoE layers")
    policy: list[PolicyConfig] = Field([PolicyConfig()], min_length=1)
    replicas: list[int] = Field([1], min_length=1)
    kind: list[Literal["colocated", "disaggregated"]] = Field(
        ["colocated"], min_length=1, description="topologies to compare: colocated, disaggregated")
    splits: list[Split] = Field([(1, 1)], min_length=1,
                                description="disaggregated: prefill:decode replicas per replica set")
    link: LinkKeys = Field(LinkKeys(), description="disaggregated: the KV link between the groups")

    @field_validator("hardware", "tp", "pp", "dp", "ep", "policy", "replicas", "kind", mode="before")
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

    @field_validator("splits", mode="before")
    @classmethod
    def _splits(cls, value: Any) -> Any:
        if isinstance(value, tuple) or not isinstance(value, list) or _is_split_pair(value):
            value = [value]  # one split: "3:1" or [3, 1]
        splits = [parse_split(v) for v in value]
        if any(p < 1 or d < 1 for p, d in splits):
            raise ValueError(f"each side of a split needs at least one replica, got {value}")
        if len(set(splits)) != len(splits):
            raise ValueError(f"lists a split twice: {value}")
        return splits

    @field_validator("tp", "pp", "dp", "ep", "replicas")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(v < 1 for v in value):
            raise ValueError(f"must be integers >= 1, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"lists a value twice: {value}")
        return value

    @field_validator("kind")
    @classmethod
    def _kinds_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"lists a kind twice: {value}")
        return value


def _is_split_pair(value: list[Any]) -> bool:
    """``splits: [3, 1]`` is one split, not two."""
    return len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


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
    early_stop: bool = Field(True, description="stop a probe once its failure is certain (the same "
                             "answer; its figures in capacity.json are then bounds)")
    saturation_stop: bool = Field(False, description="also stop a probe, as failed, when its queue "
                                  "grew in 6 windows in a row (a statistical test: it can change an answer)")


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
    gpu_budget: int | None = Field(None, ge=1, description="GPUs every candidate's fleet must fit in")
    prices: dict[str, float] = Field(default_factory=dict, description="USD per GPU-hour by hardware")
    decode_context: int | None = Field(None, ge=1, description="context of the decode-batch limits")

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_question(self) -> CapacityConfig:
        if self.target_rate is not None and self.gpu_budget is not None:
            raise ValueError("give target_rate (the fewest GPUs for a rate) or gpu_budget (the highest "
                             "rate on a number of GPUs), not both")
        return self

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
                  "candidates.hardware": "--hardware NAME", "slo": "--ttft/--tpot/--e2e (e.g. --tpot 50ms)",
                  "workload": "a workload: section"}
"""A missing key names the flag that gives it (flags and YAML share this schema)."""


def _missing_fix(field: str, key: str) -> str:
    hint = _MISSING_HINTS.get(field)
    return f"give {hint}" if hint else f"add {key}: ..."


def _as_user_error(exc: ValidationError, source: str) -> ServesimError:
    return user_error(exc, CapacityConfig, missing_fix=_missing_fix, value_fix="fix the value")

