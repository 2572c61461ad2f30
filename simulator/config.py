"""The experiment file: what to simulate, as one YAML document.

An experiment names a model and a GPU, the serving engine that runs it, how it is deployed
(topology, tensor parallelism, replicas, precision, engine limits), which scheduling policy and
router run, which traffic arrives, and optionally the SLOs to judge it by::

    name: quickstart
    seed: 0
    model: llama-3-8b                 # catalogue name or path to a HF config.json
    hardware: h100-sxm-80gb           # built-in profile (name or prefix) or a YAML path
    engine: vllm-v0                   # or {name: vllm-v0, step_overhead_s: 0.0005}
    deployment: {kind: colocated, tp: 1, replicas: 1, max_num_seqs: 256, ...}
    precision: {weights: bf16, activations: bf16, kv_cache: bf16}
    policy: {name: continuous}
    router: {name: round_robin}
    speculative: {method: eagle3, num_speculative_tokens: 3, acceptance: {rate: 0.7}}  # optional
    workload: {arrival: {process: poisson, rate: 8}, num_requests: 2000,
               lengths: {preset: azure-conversation}}
    slo: {ttft_s: 2.0, tpot_s: 0.05}

Every key is checked: a misspelt or unknown key is an error naming it, never silently ignored.
``--set deployment.tp=2`` overrides any key (the value is parsed as YAML). Engine arguments left
unset (``max_num_seqs``, ``max_num_batched_tokens``, ``block_size``, ``gpu_memory_utilization``,
``watermark``, ``enable_prefix_caching``, the policy) take the engine's defaults
(:mod:`servesim.engines`); ``max_model_len`` defaults to the model's context length.

``deployment.kind: disaggregated`` splits the service into a prefill group and a decode group
joined by a KV link (``deployment.prefill``, ``deployment.decode``, ``deployment.link``; see
:mod:`servesim.topology.disaggregated`). Configs written for servesim 0.1 spelled that
``policy: {name: disaggregated, prefill: ..., decode: ..., link: ...}``; they still load, with a
one-line migration note, and errors in them name the keys as written there.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    StrictInt,
    ValidationError,
    field_validator,
    model_serializer,
)

from servesim.engines.base import DEFAULT_ENGINE
from servesim.errors import ServesimError
from servesim.inputs.files import yaml_mapping
from servesim.inputs.names import RunName
from servesim.inputs.overrides import apply_overrides
from servesim.inputs.schema import NamedSection, OmitsUnsetExtensions, StrictModel, user_error
from servesim.inputs.slo import SloLimits
from servesim.speculative.schema import SpeculativeConfig
from servesim.topology.fleet_keys import FleetGroupKeys
from servesim.topology.keys import AllToAllBackend, DecodeGroupKeys, ExpertRoutingKeys, GroupKeys, LinkKeys
from servesim.workloads import WorkloadConfig, parse_workload_config

TOPOLOGY_KINDS = ("colocated", "disaggregated", "fleet")
MAX_SEED = 2**62
"""Seeds (plus a sweep's replications) stay within the int64 columns of the result tables."""


class MigrationNote(UserWarning):
    """A config written for an older servesim was read in its new form (the CLI prints one line)."""


class DeploymentConfig(OmitsUnsetExtensions):
    """How the model is deployed: the topology, its parallelism and the engine arguments (vLLM's
    names; unset ones take the engine's defaults)."""

    EXTENSIONS = ("groups",)

    tp: int = Field(1, ge=1, description="tensor-parallel degree")
    pp: int = Field(1, ge=1, description="pipeline stages per replica (vLLM --pipeline-parallel-size)")
    dp: int = Field(1, ge=1, description="data-parallel attention ranks per replica, each with its own "
                    "batch and KV cache, sharing the MoE layers (vLLM --data-parallel-size, SGLang "
                    "--enable-dp-attention)")
    ep: int = Field(1, ge=1, description="expert-parallel degree of the MoE layers (ep = tp x dp is vLLM's "
                    "--enable-expert-parallel)")
    pp_layers: list[int] | None = Field(None, description="layers per pipeline stage (vLLM's "
                                        "VLLM_PP_LAYER_PARTITION); default: vLLM's even split")
    all2all_backend: AllToAllBackend | None = Field(
        None, description="how MoE layers move tokens between data-parallel ranks (vLLM "
        "--all2all-backend); default allgather_reducescatter, vLLM's")
    expert_routing: ExpertRoutingKeys | None = Field(
        None, description="load imbalance between expert-parallel ranks (default: uniform routing)")
    replicas: int = Field(1, ge=1, description="data-parallel copies behind the router")
    kind: Literal["colocated", "disaggregated", "fleet"] = Field(
        "colocated", description="colocated: replicas behind a router; disaggregated: prefill and "
        "decode groups joined by a KV link; fleet: groups on any GPUs, autoscaled or not, behind one router")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    block_size: int | None = Field(None, ge=1, description="tokens per KV-cache block")
    max_num_seqs: int | None = Field(None, ge=1, description="most requests in one step")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="token budget of one step")
    max_model_len: int | None = Field(None, ge=2, description="longest prompt + output accepted")
    watermark: float | None = Field(None, ge=0, lt=1,
                                    description="fraction of KV blocks kept free when admitting prompts")
    num_gpu_blocks: int | None = Field(
        None, ge=1, description="KV blocks per replica instead of what the memory plan leaves "
        "(vLLM's num_gpu_blocks_override); must not exceed the plan")
    enable_prefix_caching: bool | None = Field(
        None, description="reuse the KV blocks of prompt prefixes shared across requests (vLLM's "
        "automatic prefix caching); sharing comes from the workload's prefix block ids")
    prefill: GroupKeys | None = Field(None, description="kind disaggregated: the prefill group")
    decode: DecodeGroupKeys | None = Field(None, description="kind disaggregated: the decode group")
    link: LinkKeys | None = Field(None, description="kind disaggregated: the KV link between them")
    groups: dict[str, FleetGroupKeys] | None = Field(
        None, description="kind fleet: its replica groups by name (servesim.topology.fleet)")


class PrecisionConfig(StrictModel):
    weights: str = "bf16"
    activations: str = "bf16"
    kv_cache: str = "bf16"
    group_size: int = Field(128, ge=1, description="int4 scale group")
    expert_weights: str | None = Field(
        None, description="format of the routed experts' weights when it differs from weights "
        "(gpt-oss ships mxfp4 experts); default: weights")

    @model_serializer(mode="wrap")
    def _omit_unset_experts(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Written out only when set, so configs and answers without it read as before."""
        data: dict[str, Any] = handler(self)
        if data.get("expert_weights") is None:
            data.pop("expert_weights", None)
        return data


class EngineConfig(NamedSection):
    """``name`` picks the serving engine; the other keys are its knobs (each engine checks its
    own). A bare string is the name."""

    name: str = DEFAULT_ENGINE


class PolicyConfig(NamedSection):
    """``name`` picks the policy (default: the engine's); the other keys are its knobs (each
    policy checks its own)."""

    name: str | None = None


class RouterConfig(NamedSection):
    """``name`` picks the router; the other keys are its knobs."""

    name: str = "round_robin"


class SloConfig(SloLimits):
    """Per-request latency limits (seconds; ``500ms`` or ``tpot_ms: 50`` on input, see
    :mod:`servesim.inputs.units`). A request meets the SLOs when it completes and each of its
    metrics given here is within its limit (DistServe's goodput definition)."""


class ExperimentConfig(StrictModel):
    name: RunName = "experiment"
    seed: StrictInt = Field(0, ge=0, le=MAX_SEED, description="seed of the workload generator")
    model: str
    hardware: str
    engine: EngineConfig = EngineConfig()
    deployment: DeploymentConfig = DeploymentConfig()
    precision: PrecisionConfig = PrecisionConfig()
    policy: PolicyConfig = PolicyConfig()
    router: RouterConfig = RouterConfig()
    speculative: SpeculativeConfig | None = Field(
        None, description="speculative decoding, as vLLM's --speculative-config (see "
        "servesim.speculative.schema); unset: none")
    workload: WorkloadConfig
    slo: SloConfig | None = None
    output: Literal["full", "summary"] = Field(
        "full", description="full: parquet tables and report.html; summary: summary.json only")
    metric_percentiles: list[float] = Field(
        [99.0], min_length=1, description="percentiles of summary.json's vLLM-named keys (p99_ttft_ms ...), "
        "as vllm bench serve --metric-percentiles")
    _legacy_disaggregated: bool = PrivateAttr(False)

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("metric_percentiles")
    @classmethod
    def _percentiles(cls, value: list[float]) -> list[float]:
        if any(not 0 < p <= 100 for p in value):
            raise ValueError(f"percentiles must be in (0, 100], got {value}")
        return sorted(set(value))

    @property
    def legacy_disaggregated(self) -> bool:
        """Read from the servesim 0.1 form ``policy: {name: disaggregated, ...}``."""
        return self._legacy_disaggregated

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=False), sort_keys=False)

    def relabel(self, error: ServesimError) -> ServesimError:
        """``error`` with the keys named as this config was written (the 0.1 form's
        ``policy.prefill`` for ``deployment.prefill``)."""
        return legacy_relabel(error) if self._legacy_disaggregated else error


# ---------------------------------------------------------------------- servesim 0.1 configs
LEGACY_POLICY_KEYS = ("prefill", "decode", "link")
_LEGACY_NOTE = ("policy: {name: disaggregated, ...} is now deployment: {kind: disaggregated, prefill, "
                "decode, link}; this config was read that way (write it so to silence this note)")


def legacy_relabel(error: ServesimError) -> ServesimError:
    """Name ``deployment.prefill|decode|link`` keys as the 0.1 form wrote them (``policy.``)."""
    pattern = re.compile(r"\bdeployment\.(prefill|decode|link)\b")
    return ServesimError(pattern.sub(r"policy.\1", error.field), pattern.sub(r"policy.\1", error.problem),
                         pattern.sub(r"policy.\1", error.fix))


def migrate_document(document: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The 0.1 form ``policy: {name: disaggregated, prefill, decode, link}`` rewritten as
    ``deployment: {kind: disaggregated, ...}`` (the groups keep their own policies; the
    experiment's policy becomes the engine's default, as the 0.1 groups defaulted to
    ``continuous``). Returns the document and whether it was rewritten."""
    policy = document.get("policy")
    if not (isinstance(policy, dict) and policy.get("name") == "disaggregated"):
        return document, False
    for key in policy:
        if key not in ("name", *LEGACY_POLICY_KEYS):
            raise ServesimError(f"policy.{key}", "unknown key",
                                f"remove it or use one of: {', '.join(LEGACY_POLICY_KEYS)}")
    deployment = document.get("deployment") or {}
    if not isinstance(deployment, dict):
        return document, False  # the schema reports the bad deployment section
    deployment = dict(deployment)
    if deployment.get("kind", "disaggregated") != "disaggregated":
        raise ServesimError("policy.name", f"disaggregated contradicts deployment.kind {deployment['kind']}",
                            "set deployment.kind: disaggregated and move prefill, decode, link there")
    deployment["kind"] = "disaggregated"
    for key in LEGACY_POLICY_KEYS:
        if key in policy:
            if key in deployment:
                raise ServesimError(f"policy.{key}", f"is also given as deployment.{key}", "keep one of them")
            deployment[key] = policy[key]
    migrated = {k: v for k, v in document.items() if k != "policy"}
    migrated["deployment"] = deployment
    warnings.warn(_LEGACY_NOTE, MigrationNote, stacklevel=2)
    return migrated, True


# ---------------------------------------------------------------------- loading
def absolute_trace_paths(workload: dict[str, Any], base_dir: Path | None) -> None:
    """Trace paths in a workload section (a JSON-ready dict) made absolute, in place, so a
    resolved experiment runs from any folder."""
    def absolute(part: Any, key: str) -> None:
        if isinstance(part, dict) and part.get(key):
            path = Path(part[key]).expanduser()
            part[key] = str((base_dir / path if base_dir and not path.is_absolute() else path).resolve())

    for section in ("trace", "lengths"):
        absolute(workload.get(section), "path" if section == "trace" else "trace")
    sessions, arrival, trace = (workload.get(key) or {} for key in ("sessions", "arrival", "trace"))
    absolute(sessions.get("conversations"), "path")
    absolute(arrival.get("profile"), "csv")
    absolute(trace.get("rate_profile"), "csv")


def read_yaml_document(path: Path) -> dict[str, Any]:
    """An experiment (or sweep, capacity) file as a mapping."""
    if not path.is_file():
        raise ServesimError("config", f"{path} not found", "give the path of an experiment YAML")
    return yaml_mapping(path, "config")


def validate_document(document: dict[str, Any], source: str = "config") -> ExperimentConfig:
    """Check an experiment mapping; the first problem becomes one line naming the key."""
    document, legacy = migrate_document(document)
    if "workload" in document:  # its own parser words workload errors best
        document = {**document, "workload": parse_workload_config(document["workload"])}
    try:
        config = ExperimentConfig.model_validate(document)
    except ValidationError as exc:
        error = user_error(exc, ExperimentConfig, missing_fix=lambda _, key: f"add {key}: ... to {source}",
                           value_fix=f"fix the value in {'the config' if source == 'config' else source}",
                           unknown_first=False)
        raise (legacy_relabel(error) if legacy else error) from None
    config._legacy_disaggregated = legacy
    return config


def load_experiment(path: str | Path, overrides: list[str] | None = None,
                    seed: int | None = None) -> ExperimentConfig:
    """Read, override and validate an experiment YAML (``seed`` beats the file's)."""
    path = Path(path)
    document = apply_overrides(read_yaml_document(path), overrides or [])
    if seed is not None:
        document["seed"] = seed
    return validate_document(document, str(path))
