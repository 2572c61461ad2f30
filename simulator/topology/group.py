"""A group of identical replicas, resolved: what every replica of it runs and with which limits.

:func:`resolve_group` turns one group's keys (the experiment's ``deployment`` section, or a
disaggregated group's keys laid over it) into a :class:`ReplicaGroup`: model, GPU, parallelism,
precision, engine and its runtime costs, the memory plan, the engine limits with the engine's
defaults filled in, and the policy. Every limit is checked here, so a bad knob or a model that
does not fit fails in ``servesim validate`` exactly as in ``servesim run``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from servesim.core.replica_state import EngineLimits
from servesim.core.swap import SwapPath
from servesim.cost import BatchShape, CostModel
from servesim.cost.expert_parallel import zipf_imbalance
from servesim.cost.parallel_step import ParallelCostModel
from servesim.cost.speculative import SpeculativeCost
from servesim.dtypes import Precision
from servesim.engines import Engine, RuntimeCosts
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.memory import MemoryPlan
from servesim.model_spec import ModelSpec
from servesim.parallel_memory import plan_replica_memory
from servesim.parallelism import Parallelism, check_parallelism, stages_of
from servesim.policies.base import Choice, Policy, prefix_caching_policies, speculating_policies
from servesim.speculative.plan import SpeculationPlan, resolve_speculation
from servesim.speculative.schema import SpeculativeConfig


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
    pp: int = 1
    dp: int = 1
    ep: int = 1
    pp_layers: list[int] | None = None
    all2all_backend: str | None = None
    expert_routing: dict[str, float] | None = None
    """``{"imbalance": f}`` or ``{"zipf": s}`` (the keys as written); None: uniform routing."""


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
    policy: Choice[Policy]
    settings: GroupKeys
    """The group's deployment keys with the engine's defaults filled in (what it ran with)."""
    speculation: SpeculationPlan | None = None
    """Speculative decoding on this group's replicas (None: none)."""

    @property
    def tp(self) -> int:
        return self.parallelism.tp

    @property
    def num_gpus(self) -> int:
        return self.parallelism.gpus_per_replica * self.replicas

    @property
    def units_per_replica(self) -> int:
        """Scheduling units of one replica (each with its own queue and KV pool): its pipeline's
        virtual engines times its data-parallel ranks; 1 for one TP group."""
        return self.parallelism.pp * self.parallelism.dp

    @property
    def units(self) -> int:
        """Scheduling units of the whole group: what routers and replica indices count."""
        return self.replicas * self.units_per_replica

    @property
    def runs_pipeline(self) -> bool:
        """Whether replicas run stages or data-parallel ranks (the pipelined replica loop)."""
        return self.parallelism.pp > 1 or self.parallelism.dp > 1

    def cost_model(self, runtime: RuntimeCosts | None = None) -> CostModel:
        """Prices this group's steps: the model on its GPUs, as its engine runs them (``runtime``
        replaces the engine's step cost). With pipeline stages or DP ranks this prices one rank
        on the first stage's GPUs; :meth:`parallel_cost_model` prices whole micro-batches.

        Without ``runtime`` the group keeps one cost model for every simulation built from it, so
        its memo of priced token parts (pure functions of the step's token counts) carries over:
        the capacity planner reuses one resolved topology for every rate it probes."""
        if runtime is None:
            return self._cost_model
        return self._new_cost_model(runtime)

    @cached_property
    def _cost_model(self) -> CostModel:
        return self._new_cost_model(None)

    def _new_cost_model(self, runtime: RuntimeCosts | None) -> CostModel:
        if self.parallelism.is_single_group:
            return CostModel(self.model, self.hardware, self.tp, self.precision, runtime or self.runtime)
        stage = stages_of(self.model, self.parallelism)[0]
        return CostModel(self.model, self.hardware, self.tp, self.precision, runtime or self.runtime,
                         self.parallelism, stage)

    def parallel_cost_model(self, runtime: RuntimeCosts | None = None) -> ParallelCostModel:
        """Prices micro-batches through this group's stages and DP ranks (each rank's proposer
        passes included when the group speculates)."""
        return ParallelCostModel(self.model, self.hardware, self.parallelism, self.precision,
                                 runtime or self.runtime, self.speculation)

    def step_pricer(self) -> CostModel | SpeculativeCost:
        """What the replicas price their steps with: the cost model, with the proposer's passes
        added when the group speculates."""
        cost = self.cost_model()
        return cost if self.speculation is None else self.speculation.cost(cost)

    def describe(self) -> dict[str, object]:
        p = self.precision
        precision = (f"weights {p.weight.value}, activations {p.activation.value}, "
                     f"kv {p.kv_cache.value}")
        if p.expert_weight is not None:
            precision += f", experts {p.expert_weight.value}"
        out: dict[str, object] = {
            "model": self.model.name, "hardware": self.hardware.name, "tp": self.tp,
            "replicas": self.replicas, "gpus": self.num_gpus, "precision": precision,
            "kv_blocks_per_replica": self.limits.num_blocks, "block_size": self.limits.block_size,
            "max_num_seqs": self.limits.max_num_seqs,
            "max_num_batched_tokens": self.limits.max_num_batched_tokens,
            "max_model_len": self.limits.max_model_len,
            "enable_prefix_caching": self.limits.enable_prefix_caching}
        par = self.parallelism
        if not par.is_single_group:
            # kv_blocks_per_replica is then each scheduling unit's pool (a virtual engine's DP rank)
            out.update(par.describe())
            out["gpus_per_replica"] = par.gpus_per_replica
            out["stage_layers"] = [s.layers for s in stages_of(self.model, par)]
            out["scheduling_units_per_replica"] = self.units_per_replica
            if self.model.moe is not None:
                out["moe_tp"] = par.moe_tp
                out["all2all_backend"] = par.all2all_backend if par.dispatches_tokens else None
                out["expert_imbalance"] = par.expert_imbalance
        return out


def resolve_group(name: str, keys: GroupKeys, model: ModelSpec, hardware: HardwareProfile,
                  precision: Precision, engine: Engine, policy: Choice[Policy],
                  speculative: SpeculativeConfig | None = None) -> ReplicaGroup:
    """Fill in the engine's defaults and check every limit of one group (errors name the
    ``deployment`` key; a topology relabels them for its groups). ``speculative``: the
    experiment's speculative decoding, resolved here with the group's model, GPU and tp."""
    defaults = engine.scheduler_defaults(hardware.name, hardware.memory.capacity_bytes, keys.tp)
    speculation = resolve_speculation(speculative, model, hardware, keys.tp, precision, engine)
    if speculation is not None and not policy.cls.supports_speculation:
        raise ServesimError("speculative", f"is not modelled for policy {policy.name!r}",
                            f"use {', '.join(speculating_policies())}, or remove speculative")
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
    if keys.max_num_seqs is None and speculation is not None and engine.speculation.max_num_seqs:
        max_num_seqs = engine.speculation.max_num_seqs  # e.g. SGLang: 48 while speculating
    if max_num_seqs > budget:
        raise ServesimError("deployment.max_num_seqs", f"{max_num_seqs} exceeds the step's token "
                            f"budget {budget}", "lower max_num_seqs or raise max_num_batched_tokens")
    utilization = keys.gpu_memory_utilization or engine.memory_fraction(
        hardware.memory.capacity_bytes, tp=keys.tp, pp=keys.pp, dp=keys.dp, chunk=budget if chunked else None,
        speculative=speculative.method if speculation is not None and speculative is not None else None,
    ) or defaults.gpu_memory_utilization
    parallelism = parallelism_of(keys, model)
    check_parallelism(model, hardware, parallelism, hybrid_experts=engine.hybrid_experts)
    if speculation is not None and parallelism.pp > 1:
        raise ServesimError("speculative", "is not modelled with pipeline stages (deployment.pp above 1)",
                            "remove speculative, or use pp: 1 (data-parallel attention ranks, "
                            "deployment.dp, do speculate)")
    memory = plan_replica_memory(model, hardware, parallelism, precision, utilization, budget, max_num_seqs,
                                 engine.memory_budget)
    if speculation is not None:
        memory = speculation.memory(memory, max_num_seqs, budget, model.vocab_size)
    if memory.state_seqs is not None and memory.state_seqs < max_num_seqs:
        max_num_seqs = memory.state_seqs  # a hybrid model runs as many sequences as it has state for
    block_size = keys.block_size or defaults.block_size
    raised = engine.hybrid_block_size(model, keys.tp, precision.kv_bytes)
    if raised is not None and raised > block_size:
        block_size = raised  # vLLM raises it itself, whatever was asked (see Vllm.hybrid_block_size)
    elif block_size > max_model_len:
        raise ServesimError("deployment.block_size", f"{block_size} tokens per KV block exceeds "
                            f"max_model_len {max_model_len}, so every request would hold one mostly "
                            "empty block", f"use a block size of at most {max_model_len} (vLLM uses 16)")
    num_blocks = memory.num_blocks(block_size)
    if keys.num_gpu_blocks is not None:
        if keys.num_gpu_blocks > num_blocks:
            raise ServesimError("deployment.num_gpu_blocks",
                                f"{keys.num_gpu_blocks:,} blocks do not fit: the memory plan leaves room "
                                f"for {num_blocks:,}", f"use at most {num_blocks:,}")
        num_blocks = keys.num_gpu_blocks
    # vLLM V0 gives each of the pipeline's virtual engines 1/pp of the blocks
    num_blocks //= parallelism.pp
    if num_blocks < 1:
        raise ServesimError("deployment", "no room for a single KV block",
                            "raise gpu_memory_utilization, use a larger tp or quantise the weights")
    watermark = defaults.watermark if keys.watermark is None else keys.watermark
    swap_path = SwapPath(block_bytes=memory.kv_bytes_per_token * block_size, gpus=keys.tp * keys.pp,
                         link=hardware.host_link)
    limits = EngineLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                          max_model_len=max_model_len, block_size=block_size, num_blocks=num_blocks,
                          watermark_blocks=math.floor(watermark * num_blocks), swap_path=swap_path,
                          enable_prefix_caching=prefix_caching)
    policy.cls.check_limits(policy.options, limits)
    settings = GroupKeys(tp=keys.tp, replicas=keys.replicas, gpu_memory_utilization=utilization,
                         block_size=block_size, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                         max_model_len=max_model_len, watermark=watermark, num_gpu_blocks=keys.num_gpu_blocks,
                         enable_prefix_caching=prefix_caching, pp=keys.pp, dp=keys.dp, ep=keys.ep,
                         pp_layers=keys.pp_layers, all2all_backend=keys.all2all_backend,
                         expert_routing=keys.expert_routing)
    runtime = engine.runtime(hardware.name, tp=keys.tp, max_num_seqs=max_num_seqs,
                             hbm_bytes=hardware.memory.capacity_bytes)
    if engine.knobs.schedule_ahead and runtime.overlap:  # a serial engine schedules at each step's end
        runtime = replace(runtime, schedule_ahead=True)
    group = ReplicaGroup(name, model, hardware, parallelism, precision, engine, runtime, memory, limits,
                         keys.replicas, policy, settings, speculation)
    check_step_time(group)
    return group


MAX_STEP_S = 3600.0
"""No real iteration takes an hour: a longer one means a profile's number is off by orders of
magnitude (a bandwidth in GB/s written as B/s), and a run would report years of latency."""


def check_step_time(group: ReplicaGroup) -> None:
    """Price the largest step the group may run (a full prompt budget with every other seat
    decoding at the longest context) and refuse a deployment whose steps are not finite and
    plausible, before a run reports nonsense (or infinity, which JSON cannot hold)."""
    lim = group.limits
    seats = max(0, min(lim.max_num_seqs, lim.max_num_batched_tokens) - 1)
    shape = BatchShape.build([min(lim.max_num_batched_tokens, lim.max_model_len)], None,
                             [lim.max_model_len - 1] * seats)
    try:
        seconds = group.cost_model().step_time(shape)
    except ServesimError:
        return  # the cost model refuses this deployment itself, when a run prices its first step
    if not 0 < seconds <= MAX_STEP_S:
        raise ServesimError("hardware", f"{group.hardware.name} would take {seconds:.3g} s for one step of "
                            f"{group.model.name} (a full token budget), which no GPU does",
                            "check the profile's peak_flops, memory and interconnect numbers (units: "
                            "FLOP/s, bytes, bytes/s)")


def parallelism_of(keys: GroupKeys, model: ModelSpec) -> Parallelism:
    """The layout the keys ask for, with the expert routing turned into the busiest expert rank's
    load factor (a Zipf exponent is converted by :func:`~servesim.cost.expert_parallel.zipf_imbalance`)."""
    routing = keys.expert_routing or {}
    if "imbalance" in routing and "zipf" in routing:
        raise ServesimError("deployment.expert_routing", "gives both imbalance and zipf",
                            "keep one: a measured imbalance, or a Zipf exponent to compute it from")
    imbalance = float(routing.get("imbalance", 1.0))
    if "zipf" in routing:
        if model.moe is None or keys.ep == 1:
            raise ServesimError("deployment.expert_routing", "skewed routing needs expert parallelism",
                                "set ep > 1 or remove expert_routing")
        imbalance = zipf_imbalance(model.moe.num_experts, model.moe.top_k, keys.ep, float(routing["zipf"]))
    return Parallelism(tp=keys.tp, pp=keys.pp, dp=keys.dp, ep=keys.ep, pp_layers=tuple(keys.pp_layers or ()),
                       all2all_backend=keys.all2all_backend or "allgather_reducescatter",
                       expert_imbalance=imbalance)
