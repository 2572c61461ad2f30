"""A group of identical replicas, resolved: what every replica of it runs and with which limits.

:func:`resolve_group` turns one group's keys (the experiment's ``deployment`` section, or a
disaggregated group's keys laid over it) into a :class:`ReplicaGroup`: model, GPU, parallelism,
precision, engine and its runtime costs, the memory plan, the engine limits with the engine's
defaults filled in, and the policy. Every limit is checked here, so a bad knob or a model that
does not fit fails in ``servesim validate`` exactly as in ``servesim run``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from servesim.core.replica_state import EngineLimits, ReplicaState
from servesim.core.swap import SwapPath
from servesim.cost import CostModel
from servesim.dtypes import Precision
from servesim.engines import Engine, RuntimeCosts
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.memory import MemoryPlan, plan_memory
from servesim.model_spec import ModelSpec
from servesim.policies.base import POLICIES, Policy, PolicyOptions, check_policy


@dataclass(frozen=True)
class Parallelism:
    """How one replica spreads over GPUs. Tensor parallelism today; pipeline stages, expert
    parallelism and data-parallel attention ranks join as fields that multiply
    :attr:`gpus_per_replica`."""

    tp: int = 1

    @property
    def gpus_per_replica(self) -> int:
        return self.tp

    def describe(self) -> dict[str, int]:
        return {"tp": self.tp}


@dataclass(frozen=True)
class PolicyChoice:
    """A group's scheduling policy: its class and validated knobs."""

    name: str
    cls: type[Policy]
    options: PolicyOptions
    knobs: dict[str, Any]
    """The knobs as written (for descriptions and resolved configs)."""

    def make(self, state: ReplicaState) -> Policy:
        return self.cls(state, self.options)


def prefix_caching_policies() -> list[str]:
    """The registered policies that admit through the prefix cache."""
    return sorted(name for name, cls in POLICIES.items() if cls.supports_prefix_caching)


def choose_policy(name: str, knobs: dict[str, Any], where: str = "policy") -> PolicyChoice:
    """The policy ``name`` with its knobs checked; errors name ``where`` (``policy``,
    ``deployment.decode.policy``)."""
    try:
        cls, options = check_policy(name, knobs)
    except ServesimError as exc:
        raise ServesimError(exc.field.replace("policy", where, 1), exc.problem, exc.fix) from None
    return PolicyChoice(name, cls, options, knobs)


@dataclass(frozen=True)
class GroupKeys:
    """One group's deployment keys after the group's own overrides, before engine defaults."""

    tp: int
    replicas: int
    gpu_memory_utilization: float | None
    block_size: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    max_model_len: int | None
    watermark: float | None
    num_gpu_blocks: int | None
    enable_prefix_caching: bool | None


@dataclass(frozen=True)
class ReplicaGroup:
    """Identical replicas: one model on one kind of GPU with one parallelism, engine and policy."""

    name: str
    """``replicas`` for a colocated deployment; ``prefill`` / ``decode`` for the disaggregated
    groups (the ``pool`` column of the step table and the ``pools`` of its summary section)."""
    model: ModelSpec
    hardware: HardwareProfile
    parallelism: Parallelism
    precision: Precision
    engine: Engine
    runtime: RuntimeCosts
    memory: MemoryPlan
    limits: EngineLimits
    replicas: int
    policy: PolicyChoice
    settings: GroupKeys
    """The group's deployment keys with the engine's defaults filled in (what it ran with)."""

    @property
    def tp(self) -> int:
        return self.parallelism.tp

    @property
    def num_gpus(self) -> int:
        return self.parallelism.gpus_per_replica * self.replicas

    def cost_model(self, runtime: RuntimeCosts | None = None) -> CostModel:
        """Prices this group's steps: the model on its GPUs, as its engine runs them (``runtime``
        replaces the engine's step cost)."""
        return CostModel(self.model, self.hardware, self.tp, self.precision, runtime or self.runtime)

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


def resolve_group(name: str, keys: GroupKeys, model: ModelSpec, hardware: HardwareProfile,
                  precision: Precision, engine: Engine, policy: PolicyChoice) -> ReplicaGroup:
    """Fill in the engine's defaults and check every limit of one group (errors name the
    ``deployment`` key; a topology relabels them for its groups)."""
    defaults = engine.scheduler_defaults(hardware.name, hardware.memory.capacity_bytes, keys.tp)
    prefix_caching = defaults.enable_prefix_caching if keys.enable_prefix_caching is None \
        else keys.enable_prefix_caching
    if prefix_caching and not policy.cls.supports_prefix_caching:
        raise ServesimError("deployment.enable_prefix_caching",
                            f"is not modelled for policy {policy.name!r} ({policy.cls.prefix_caching_note})",
                            f"remove it or use {', '.join(prefix_caching_policies())}")
    max_model_len = keys.max_model_len or model.max_context
    if max_model_len > model.max_context:
        raise ServesimError("deployment.max_model_len",
                            f"{max_model_len} exceeds {model.name}'s context length {model.max_context}",
                            f"use at most {model.max_context}")
    chunked = policy.cls.chunks_prefills
    budget = keys.max_num_batched_tokens or defaults.max_num_batched_tokens(max_model_len, chunked)
    if not chunked and budget < max_model_len:
        raise ServesimError(
            "deployment.max_num_batched_tokens",
            f"{budget} is below max_model_len {max_model_len}, so a long prompt could never be "
            f"scheduled by policy {policy.name!r}",
            f"raise it to {max_model_len}, lower deployment.max_model_len, or use chunked prefill")
    max_num_seqs = keys.max_num_seqs or defaults.max_num_seqs
    if max_num_seqs > budget:
        raise ServesimError("deployment.max_num_seqs", f"{max_num_seqs} exceeds the step's token "
                            f"budget {budget}", "lower max_num_seqs or raise max_num_batched_tokens")
    utilization = keys.gpu_memory_utilization or defaults.gpu_memory_utilization
    memory = plan_memory(model, hardware, keys.tp, precision, utilization, budget, max_num_seqs)
    block_size = keys.block_size or defaults.block_size
    num_blocks = memory.num_blocks(block_size)
    if keys.num_gpu_blocks is not None:
        if keys.num_gpu_blocks > num_blocks:
            raise ServesimError("deployment.num_gpu_blocks",
                                f"{keys.num_gpu_blocks:,} blocks do not fit: the memory plan leaves room "
                                f"for {num_blocks:,}", f"use at most {num_blocks:,}")
        num_blocks = keys.num_gpu_blocks
    if num_blocks < 1:
        raise ServesimError("deployment", "no room for a single KV block",
                            "raise gpu_memory_utilization, use a larger tp or quantise the weights")
    watermark = defaults.watermark if keys.watermark is None else keys.watermark
    swap_path = SwapPath(block_bytes=memory.kv_bytes_per_token * block_size, gpus=keys.tp,
                         link=hardware.host_link)
    limits = EngineLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                          max_model_len=max_model_len, block_size=block_size, num_blocks=num_blocks,
                          watermark_blocks=math.floor(watermark * num_blocks), swap_path=swap_path,
                          enable_prefix_caching=prefix_caching)
    policy.cls.check_limits(policy.options, limits)
    settings = GroupKeys(tp=keys.tp, replicas=keys.replicas, gpu_memory_utilization=utilization,
                         block_size=block_size, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                         max_model_len=max_model_len, watermark=watermark, num_gpu_blocks=keys.num_gpu_blocks,
                         enable_prefix_caching=prefix_caching)
    runtime = engine.runtime(hardware.name, tp=keys.tp, max_num_seqs=max_num_seqs,
                             hbm_bytes=hardware.memory.capacity_bytes)
    return ReplicaGroup(name, model, hardware, Parallelism(tp=keys.tp), precision, engine,
                        runtime, memory, limits, keys.replicas, policy, settings)
