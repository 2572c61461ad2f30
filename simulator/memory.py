"""Per-GPU memory budget of a deployment, and the KV-cache pool that falls out of it.

Each engine reads its memory fraction (``gpu_memory_utilization`` here) its own way
(:data:`BUDGET_RULES`, chosen by the engine's ``memory_budget``):

- ``whole_gpu`` (vLLM's ``--gpu-memory-utilization``): of the GPU's HBM, that fraction may be
  used; from it come off the runtime's reserve (CUDA context, NCCL buffers), the weights (this
  GPU's shard) and the peak activation workspace of the largest step the scheduler may run
  (``max_num_batched_tokens`` tokens, ``max_num_seqs`` rows of fp32 logits);
- ``weights_and_kv`` (SGLang's ``--mem-fraction-static``): the fraction holds the weights and the
  KV pool only; activations and CUDA graphs live in the rest of the GPU, so only the runtime's
  reserve and the weights come off it (``profile_max_num_token``: the memory free after loading,
  less the total times one minus the fraction);
- ``free_after_load`` (TensorRT-LLM's ``kv_cache_config.free_gpu_memory_fraction``): the KV pool
  takes that fraction of what is free once the reserve, the weights and the activation workspace
  are allocated.

What is left holds KV blocks of ``block_size`` tokens, once a hybrid model (Qwen3-Next, Qwen3.5,
Nemotron-H) has set aside its linear-attention layers' recurrent state (fixed per sequence, not
per token) for ``max_num_seqs`` sequences, or for as many as :data:`STATE_SHARE` of the pool
holds (:func:`with_state`), which then caps the sequences the engine runs.

The activation estimate is the largest set of tensors alive at once in one layer: the hidden
state and the residual, plus the widest of the QKV output and the MLP's up-projection output
with its activation (all 16-bit), plus the logits. vLLM measures this with a profiling run; the
estimate is within a few hundred MB of it for dense models, which matters only for small GPUs.
The logits are gathered, so every GPU holds the full vocabulary's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from servesim.dtypes import Precision
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.model_spec import ModelSpec, ceil_div

ACTIVATION_BYTES = 2.0
"""Intermediate activations are 16-bit even under FP8 GEMMs (outputs are written in bf16)."""
LOGIT_BYTES = 4.0
"""The sampler works on fp32 logits."""
BUDGET_RULES = ("whole_gpu", "weights_and_kv", "free_after_load")
"""How an engine's memory fraction becomes its KV pool (see the module docstring)."""


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes on one GPU of the tensor-parallel group."""

    capacity_bytes: float
    gpu_memory_utilization: float
    reserved_bytes: float
    weight_bytes: float
    activation_bytes: float
    kv_bytes_per_token: float
    budget_rule: str = "whole_gpu"
    """How ``gpu_memory_utilization`` is read (:data:`BUDGET_RULES`)."""
    state_bytes: float = 0.0
    """A hybrid model's recurrent state for :attr:`state_seqs` running sequences (its
    linear-attention layers keep a fixed-size state per sequence instead of KV per token), set
    aside before the KV pool is cut into blocks; 0 for every other model."""
    state_seqs: int | None = None
    """How many sequences' state is set aside (:func:`with_state`): ``max_num_seqs``, or fewer when
    that much state would take more than :data:`STATE_SHARE` of the pool, and then the engine runs
    at most that many sequences. None for a model without recurrent state."""

    @property
    def budget_bytes(self) -> float:
        """The memory the weights, the workspace the rule counts and the KV pool share."""
        if self.budget_rule == "free_after_load":
            return self.capacity_bytes
        return self.capacity_bytes * self.gpu_memory_utilization

    @property
    def kv_cache_bytes(self) -> float:
        """What remains for the KV cache (negative when the model does not fit)."""
        if self.budget_rule == "weights_and_kv":
            return self.budget_bytes - self.reserved_bytes - self.weight_bytes - self.state_bytes
        left = self.budget_bytes - self.reserved_bytes - self.weight_bytes - self.activation_bytes
        if self.budget_rule == "free_after_load":
            return (left * self.gpu_memory_utilization if left > 0 else left) - self.state_bytes
        return left - self.state_bytes

    @property
    def needed_bytes(self) -> float:
        """What must fit in :attr:`budget_bytes` before any KV block: the reserve, the weights and,
        where the rule counts it there, the activation workspace."""
        counted = 0.0 if self.budget_rule == "weights_and_kv" else self.activation_bytes
        return self.reserved_bytes + self.weight_bytes + counted + self.state_bytes

    @property
    def kv_token_capacity(self) -> int:
        """Tokens of KV cache the pool holds (before rounding to blocks)."""
        return max(0, math.floor(self.kv_cache_bytes / self.kv_bytes_per_token))

    def num_blocks(self, block_size: int = 16) -> int:
        return max(0, math.floor(self.kv_cache_bytes / (self.kv_bytes_per_token * block_size)))

    def to_dict(self) -> dict[str, float]:
        return {"capacity_bytes": self.capacity_bytes,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "reserved_bytes": self.reserved_bytes, "weight_bytes": self.weight_bytes,
                "activation_bytes": self.activation_bytes, "kv_cache_bytes": self.kv_cache_bytes,
                **({"state_bytes": self.state_bytes} if self.state_bytes else {}),
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "kv_token_capacity": self.kv_token_capacity}


STATE_SHARE = 0.9 / 1.9
"""The most of the memory left for the KV pool a hybrid model's recurrent state may take: SGLang's
``--mamba-full-memory-ratio`` default (0.9: state memory 0.9 x the full-attention KV memory)
caps its running requests at the state slots that share buys. vLLM's hybrid allocator draws both
from one pool per request; the same share stands in for it (an estimate)."""


def with_state(plan: MemoryPlan, per_seq: float, max_num_seqs: int) -> MemoryPlan:
    """``plan`` with a hybrid model's recurrent state set aside (``per_seq`` bytes per sequence on
    this GPU): for ``max_num_seqs`` sequences when that takes at most :data:`STATE_SHARE` of the
    pool, else for as many as that share holds (at least one, so that a pool too small for any
    state still reports it)."""
    if per_seq <= 0:
        return plan
    free = plan.kv_cache_bytes
    seqs = max_num_seqs
    if free > 0 and max_num_seqs * per_seq > STATE_SHARE * free:
        seqs = max(1, math.floor(STATE_SHARE * free / per_seq))
    return replace(plan, state_bytes=seqs * per_seq, state_seqs=seqs)


def activation_workspace_bytes(model: ModelSpec, tp: int, max_num_batched_tokens: int,
                               max_num_seqs: int) -> float:
    """Peak activation memory of the largest step (see the module docstring)."""
    h = model.hidden_size
    heads = model.num_heads // tp
    if model.mla is not None:
        qkv = heads * (2 * model.q_head_dim + model.v_head_dim)  # expanded for prefill
    else:
        qkv = (heads + 2 * max(1, model.num_kv_heads // tp)) * model.head_dim
    mlp_widths = 3 if model.gated_mlp else 2  # gate and up outputs plus the activation

    def mlp(intermediate: int) -> int:
        return mlp_widths * ceil_div(intermediate, tp)

    widest = max(qkv, mlp(model.intermediate_size) if model.num_dense_layers else 0)
    if model.moe is not None:
        widest = max(widest, model.moe.top_k * (mlp(model.moe.expert_intermediate) + h))
    per_token = (2 * h + widest) * ACTIVATION_BYTES
    logits = max_num_seqs * model.vocab_size * LOGIT_BYTES  # gathered: the full vocabulary
    return max_num_batched_tokens * per_token + logits


def _build_plan(model: ModelSpec, hardware: HardwareProfile, tp: int, precision: Precision,
                gpu_memory_utilization: float, max_num_batched_tokens: int,
                max_num_seqs: int, budget_rule: str = "whole_gpu") -> MemoryPlan:
    plan = MemoryPlan(
        capacity_bytes=hardware.memory.capacity_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        reserved_bytes=hardware.memory.reserved_bytes,
        weight_bytes=model.weight_bytes(precision.weight, precision.group_size, tp, precision.expert_weight),
        activation_bytes=activation_workspace_bytes(model, tp, max_num_batched_tokens,
                                                    max_num_seqs),
        kv_bytes_per_token=model.kv_bytes_per_token(precision.kv_cache, tp, precision.group_size),
        budget_rule=budget_rule,
    )
    return with_state(plan, model.linear_state_bytes(tp), max_num_seqs)


def check_group_size(model: ModelSpec, precision: Precision, tp: int) -> None:
    """A grouped format (int4) keeps one scale per ``group_size`` consecutive input rows of each
    weight matrix, on each GPU's shard: the group must divide the rows of every GEMM's input, as
    GPTQ/AWQ kernels require (``input_size_per_partition % group_size == 0`` in vLLM)."""
    if not precision.weight.is_grouped:
        return
    group = precision.group_size
    rows = {"hidden_size": model.hidden_size}
    if model.num_dense_layers:
        rows["intermediate_size / tp"] = model.intermediate_size // tp
    if model.moe is not None:
        rows["moe_intermediate_size / tp"] = model.moe.expert_intermediate // tp
    for name, count in rows.items():
        if count % group:
            divisors = [g for g in (32, 64, 128) if all(c % g == 0 for c in rows.values())]
            hint = f"use group_size {divisors[-1]}" if divisors else "use another weight format"
            raise ServesimError("precision.group_size", f"{group} does not divide {model.name}'s "
                                f"{name} ({count} rows), so {precision.weight.value} groups cannot tile "
                                "the weights", hint)


def plan_memory(model: ModelSpec, hardware: HardwareProfile, tp: int = 1,
                precision: Precision | None = None, gpu_memory_utilization: float = 0.9,
                max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
                budget_rule: str = "whole_gpu") -> MemoryPlan:
    """The per-GPU budget (``budget_rule``: how the engine reads ``gpu_memory_utilization``,
    :data:`BUDGET_RULES`); raises when the weights and workspace alone do not fit."""
    precision = precision or Precision()
    model.check_tensor_parallel(tp)
    check_group_size(model, precision, tp)
    if not 0 < gpu_memory_utilization <= 1:
        raise ServesimError("deployment.gpu_memory_utilization",
                            f"must be in (0, 1], got {gpu_memory_utilization}", "use e.g. 0.9")
    limits = (gpu_memory_utilization, max_num_batched_tokens, max_num_seqs, budget_rule)
    plan = _build_plan(model, hardware, tp, precision, *limits)
    if plan.kv_cache_bytes <= 0:
        gib = 2**30
        need = plan.needed_bytes / gib
        fits_tp = smallest_fitting_tp(model, hardware, precision, *limits)
        hint = (f"use deployment.tp: {fits_tp} or more" if fits_tp else "use a larger GPU")
        raise ServesimError(
            "deployment.tp",
            f"{model.name} needs {need:.1f} GiB per GPU for weights and activations at tp {tp} "
            f"but {hardware.name} offers {plan.budget_bytes / gib:.1f} GiB "
            f"(gpu_memory_utilization {gpu_memory_utilization})",
            f"{hint}, or quantise the weights (e.g. precision.weights: int4)")
    return plan


def smallest_fitting_tp(model: ModelSpec, hardware: HardwareProfile, precision: Precision,
                        gpu_memory_utilization: float, max_num_batched_tokens: int,
                        max_num_seqs: int, budget_rule: str = "whole_gpu") -> int | None:
    """The smallest valid power-of-two TP degree (up to 64) that leaves room for a KV cache."""
    for tp in (1, 2, 4, 8, 16, 32, 64):
        try:
            model.check_tensor_parallel(tp)
        except ServesimError:
            continue
        plan = _build_plan(model, hardware, tp, precision, gpu_memory_utilization,
                           max_num_batched_tokens, max_num_seqs, budget_rule)
        if plan.kv_cache_bytes > 0:
            return tp
    return None
