"""From an experiment's deployment keys to the objects a replica runs: model, hardware, cost
model, memory plan and engine limits, with vLLM's defaults filled in and every limit checked."""

from __future__ import annotations

import math
from dataclasses import dataclass

import servesim.policies  # noqa: F401  (registers the built-in policies and routers)
from servesim.config import ExperimentConfig, PolicyConfig, RouterConfig
from servesim.cost import CostModel
from servesim.dtypes import Precision
from servesim.engine.replica_state import EngineLimits
from servesim.engine.swap import SwapPath
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.hardware_io import load_hardware
from servesim.memory import MemoryPlan, plan_memory
from servesim.model_config import load_model
from servesim.model_spec import ModelSpec
from servesim.policies.base import check_policy
from servesim.policies.routers import check_router


@dataclass(frozen=True)
class Deployment:
    model: ModelSpec
    hardware: HardwareProfile
    tp: int
    replicas: int
    precision: Precision
    memory: MemoryPlan
    limits: EngineLimits

    def cost_model(self) -> CostModel:
        return CostModel(self.model, self.hardware, self.tp, self.precision)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.replicas

    def describe(self) -> dict[str, object]:
        p = self.precision
        precision = (f"weights {p.weight.value}, activations {p.activation.value}, "
                     f"kv {p.kv_cache.value}")
        return {"model": self.model.name, "hardware": self.hardware.name, "tp": self.tp,
                "replicas": self.replicas, "gpus": self.num_gpus, "precision": precision,
                "kv_blocks_per_replica": self.limits.num_blocks, "block_size": self.limits.block_size,
                "max_num_seqs": self.limits.max_num_seqs,
                "max_num_batched_tokens": self.limits.max_num_batched_tokens,
                "max_model_len": self.limits.max_model_len,
                "enable_prefix_caching": self.limits.enable_prefix_caching}


def resolve_deployment(config: ExperimentConfig) -> Deployment:
    """Everything a run needs before the first event, checked: a bad policy knob or a model that
    does not fit fails here, in ``servesim validate`` as in ``servesim run``. A disaggregated
    experiment gets a :class:`~servesim.engine.pools.DisaggregatedDeployment` (two pools)."""
    if config.policy.name in NO_PREFIX_CACHING_POLICIES and config.deployment.enable_prefix_caching:
        raise ServesimError("deployment.enable_prefix_caching",
                            f"is not modelled for policy {config.policy.name!r} "
                            f"({NO_PREFIX_CACHING_POLICIES[config.policy.name]})",
                            "remove it or use continuous, chunked_prefill, sjf or priority")
    if config.policy.name == "disaggregated":
        from servesim.engine.pools import resolve_disaggregated  # it builds on this function

        return resolve_disaggregated(config)  # type: ignore[return-value]
    d, p = config.deployment, config.precision
    policy_cls, policy_options = check_policy(config.policy.name, policy_knobs(config.policy))
    check_router(config.router.name, policy_knobs(config.router))
    if config.router.name in PREFIX_ROUTERS and not d.enable_prefix_caching:
        raise ServesimError("router.name", f"{config.router.name} routes by what the replicas' prefix "
                            "caches hold, and prefix caching is off",
                            "set deployment.enable_prefix_caching: true or pick another router")
    model = load_model(config.model, "model")
    hardware = load_hardware(config.hardware, "hardware")
    precision = Precision.from_names(p.weights, p.activations, p.kv_cache, p.group_size)
    max_model_len = d.max_model_len or model.max_context
    if max_model_len > model.max_context:
        raise ServesimError("deployment.max_model_len",
                            f"{max_model_len} exceeds {model.name}'s context length {model.max_context}",
                            f"use at most {model.max_context}")
    chunked = config.policy.name in CHUNKING_POLICIES
    budget = d.max_num_batched_tokens or (CHUNKED_DEFAULT_BUDGET if chunked else max(max_model_len, 2048))
    if not chunked and budget < max_model_len:
        raise ServesimError(
            "deployment.max_num_batched_tokens",
            f"{budget} is below max_model_len {max_model_len}, so a long prompt could never be "
            f"scheduled by policy {config.policy.name!r}",
            f"raise it to {max_model_len}, lower deployment.max_model_len, or use chunked prefill")
    if d.max_num_seqs > budget:
        raise ServesimError("deployment.max_num_seqs", f"{d.max_num_seqs} exceeds the step's token "
                            f"budget {budget}", "lower max_num_seqs or raise max_num_batched_tokens")
    memory = plan_memory(model, hardware, d.tp, precision, d.gpu_memory_utilization, budget,
                         d.max_num_seqs)
    num_blocks = memory.num_blocks(d.block_size)
    if d.num_gpu_blocks is not None:
        if d.num_gpu_blocks > num_blocks:
            raise ServesimError("deployment.num_gpu_blocks",
                                f"{d.num_gpu_blocks:,} blocks do not fit: the memory plan leaves room "
                                f"for {num_blocks:,}", f"use at most {num_blocks:,}")
        num_blocks = d.num_gpu_blocks
    if num_blocks < 1:
        raise ServesimError("deployment", "no room for a single KV block",
                            "raise gpu_memory_utilization, use a larger tp or quantise the weights")
    host = hardware.host_link
    swap_path = SwapPath(block_bytes=memory.kv_bytes_per_token * d.block_size, gpus=d.tp,
                         bandwidth_Bps=host.bandwidth_Bps * host.efficiency, latency_s=host.latency_s)
    limits = EngineLimits(max_num_seqs=d.max_num_seqs, max_num_batched_tokens=budget,
                          max_model_len=max_model_len, block_size=d.block_size, num_blocks=num_blocks,
                          watermark_blocks=math.floor(d.watermark * num_blocks), swap_path=swap_path,
                          enable_prefix_caching=d.enable_prefix_caching)
    policy_cls.check_limits(policy_options, limits)
    return Deployment(model, hardware, d.tp, d.replicas, precision, memory, limits)


def policy_knobs(section: PolicyConfig | RouterConfig) -> dict[str, object]:
    """A policy or router section's knobs: every key but ``name``."""
    return {k: v for k, v in section.model_dump().items() if k != "name"}


NO_PREFIX_CACHING_POLICIES = {
    "static": "it reserves and prefills whole prompts itself, as engines before prefix caching did",
    "disaggregated": "its prefill and decode pools do not share a prefix cache yet"}
"""Policies that do not admit through ReplicaState.prefill_need/admit, so a hit would be lost."""

PREFIX_ROUTERS = frozenset({"prefix_affinity"})
"""Routers that read the replicas' prefix caches, so they need prefix caching on."""

CHUNKING_POLICIES = frozenset({"chunked_prefill"})
"""Policies that split prompts across steps, so their token budget may be below max_model_len."""

CHUNKED_DEFAULT_BUDGET = 2048
"""vLLM's default ``max_num_batched_tokens`` with chunked prefill (``DEFAULT_MAX_NUM_BATCHED_TOKENS``
in vllm/utils, "a balance between ITL and TTFT, not optimized for throughput")."""
