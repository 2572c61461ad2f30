"""The experiment file: what to simulate, as one YAML document.

An experiment names a model and a GPU, says how they are deployed (tensor parallelism, replicas,
precision, the vLLM-style engine limits), which scheduling policy and router run, which traffic
arrives, and optionally the SLOs to judge it by::

    name: quickstart
    seed: 0
    model: llama-3-8b                 # catalogue name or path to a HF config.json
    hardware: h100-sxm-80gb           # built-in profile (name or prefix) or a YAML path
    deployment: {tp: 1, replicas: 1, gpu_memory_utilization: 0.9, block_size: 16,
                 max_num_seqs: 256, max_num_batched_tokens: null, max_model_len: null}
    precision: {weights: bf16, activations: bf16, kv_cache: bf16}
    policy: {name: continuous}
    router: {name: round_robin}
    workload: {arrival: {process: poisson, rate: 8}, num_requests: 2000,
               lengths: {preset: azure-conversation}}
    slo: {ttft_s: 2.0, tpot_s: 0.05}

Every key is checked: a misspelt or unknown key is an error naming it, never silently ignored.
``--set deployment.tp=2`` overrides any key (the value is parsed as YAML). Defaults follow vLLM:
``max_model_len`` is the model's context length, ``max_num_batched_tokens`` is
``max(max_model_len, 2048)`` (vLLM's default without chunked prefill, so that any admissible
prompt fits one step), ``max_num_seqs`` 256, ``block_size`` 16, ``gpu_memory_utilization`` 0.9
and a 1% free-block watermark for admitting new prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError
from servesim.errors import ServesimError
from servesim.workloads import WorkloadConfig, parse_workload_config


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeploymentConfig(_Strict):
    """How many GPUs run the model and with which engine limits (vLLM's names and defaults)."""

    tp: int = Field(1, ge=1, description="tensor-parallel degree")
    replicas: int = Field(1, ge=1, description="data-parallel copies behind the router")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    block_size: int = Field(16, ge=1, description="tokens per KV-cache block")
    max_num_seqs: int = Field(256, ge=1, description="most requests in one step")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="token budget of one step")
    max_model_len: int | None = Field(None, ge=2, description="longest prompt + output accepted")
    watermark: float = Field(0.01, ge=0, lt=1,
                             description="fraction of KV blocks kept free when admitting prompts")
    num_gpu_blocks: int | None = Field(
        None, ge=1, description="KV blocks per replica instead of what the memory plan leaves "
        "(vLLM's num_gpu_blocks_override); must not exceed the plan")
    enable_prefix_caching: bool = Field(
        False, description="reuse the KV blocks of prompt prefixes shared across requests (vLLM's "
        "automatic prefix caching); sharing comes from the workload's prefix block ids")


class PrecisionConfig(_Strict):
    weights: str = "bf16"
    activations: str = "bf16"
    kv_cache: str = "bf16"
    group_size: int = Field(128, ge=1, description="int4 scale group")


class PolicyConfig(BaseModel):
    """``name`` picks the policy; the other keys are its knobs (each policy checks its own)."""

    model_config = ConfigDict(extra="allow")
    name: str = "continuous"


class RouterConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = "round_robin"


class SloConfig(_Strict):
    """Per-request latency limits in seconds. A request meets the SLOs when it completes and each
    of its metrics given here is within its limit (DistServe's goodput definition)."""

    ttft_s: float | None = Field(None, gt=0)
    tpot_s: float | None = Field(None, gt=0)
    e2e_s: float | None = Field(None, gt=0)

    def limits(self) -> dict[str, float]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ExperimentConfig(_Strict):
    name: str = "experiment"
    seed: StrictInt = Field(0, ge=0, description="seed of the workload generator")
    model: str
    hardware: str
    deployment: DeploymentConfig = DeploymentConfig()
    precision: PrecisionConfig = PrecisionConfig()
    policy: PolicyConfig = PolicyConfig()
    router: RouterConfig = RouterConfig()
    workload: WorkloadConfig
    slo: SloConfig | None = None
    output: Literal["full", "summary"] = Field(
        "full", description="full: parquet tables and report.html; summary: summary.json only")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=False), sort_keys=False)


# ---------------------------------------------------------------------- loading
def parse_override(text: str) -> tuple[list[str], Any]:
    """``"deployment.tp=2"`` -> (["deployment", "tp"], 2); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ServesimError("--set", f"{text!r} is not path.to.key=value", "write e.g. --set deployment.tp=2")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(document: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = document
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ServesimError(f"--set {'.'.join(path)}", f"{part!r} is a value, not a section",
                                    f"set {part} itself")
            node = child
        node[path[-1]] = value
    return document


def read_yaml_document(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ServesimError("config", f"{path} not found", "give the path of an experiment YAML")
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise ServesimError("config", f"{path}{where}: {problem}", "fix the YAML syntax") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ServesimError("config", f"{path} holds a {type(document).__name__}, not a mapping",
                            "write key: value pairs at the top level")
    return document


def validate_document(document: dict[str, Any], source: str = "config") -> ExperimentConfig:
    if "workload" in document:  # its own parser words workload errors best
        document = {**document, "workload": parse_workload_config(document["workload"])}
    try:
        return ExperimentConfig.model_validate(document)
    except ValidationError as exc:
        raise _as_user_error(exc, source) from None


def load_experiment(path: str | Path, overrides: list[str] | None = None,
                    seed: int | None = None) -> ExperimentConfig:
    """Read, override and validate an experiment YAML (``seed`` beats the file's)."""
    path = Path(path)
    document = apply_overrides(read_yaml_document(path), overrides or [])
    if seed is not None:
        document["seed"] = seed
    return validate_document(document, str(path))


def _as_user_error(exc: ValidationError, source: str) -> ServesimError:
    return user_error(exc, ExperimentConfig, source, missing_fix=lambda _, key: f"add {key}: ... to {source}",
                      value_fix="fix the value in the config")


def user_error(exc: ValidationError, root: type[BaseModel], source: str,
               missing_fix: Callable[[str, str], str], value_fix: str,
               unknown_first: bool = False) -> ServesimError:
    """A pydantic error on a YAML schema (``root``) as one line: the dotted key, what is wrong, how
    to fix it (for an unknown key, the keys allowed there). Shared by every schema; each words its
    own fixes (``missing_fix`` gets the dotted field and its last key). ``unknown_first`` reports
    a misspelt key before any other problem."""
    errors = exc.errors()
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0]) if unknown_first \
        else errors[0]
    loc = [str(part) for part in error["loc"] if not str(part).startswith("function-")]
    field = ".".join(loc) or source
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = allowed_keys(root, loc[:-1])
        fix = f"remove it or use one of: {', '.join(allowed)}" if allowed else "remove it"
        return ServesimError(field, "unknown key", fix)
    if kind == "missing":
        return ServesimError(field, "is required", missing_fix(field, loc[-1]))
    got = error.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    message = error["msg"].removeprefix("Value error, ").rstrip(".")
    return ServesimError(field, f"{message}{shown}", value_fix)


def allowed_keys(root: type[BaseModel], loc: list[str]) -> list[str]:
    """The keys allowed at ``loc`` inside the pydantic model ``root`` (for "unknown key" hints);
    shared by every YAML schema (experiment, capacity)."""
    model: Any = root
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return []
        annotation = fields[part].annotation
        candidates = [a for a in getattr(annotation, "__args__", (annotation,)) if hasattr(a, "model_fields")]
        if not candidates:
            return []
        model = candidates[0]
    return list(getattr(model, "model_fields", {}))
