"""Per-GPU memory of a replica with pipeline stages, expert parallelism or data-parallel ranks.

:mod:`servesim.memory` plans one GPU of a tensor-parallel group that holds every layer. Here each
pipeline stage's GPUs hold only their stage's layers (the first stage also the embedding, the
last the LM head; a model with tied embeddings keeps a copy on both, as vLLM loads it), and the
routed experts are split over ``ep`` GPUs and sliced ``moe_tp`` ways instead of ``tp`` ways. Every
stage sizes its KV pool from what its GPUs have left, for its own layers' KV; a token's KV lives
on every stage at once, so the replica holds as many tokens as its tightest stage (vLLM takes the
minimum of the workers' block counts). The plan returned is that stage's.

With data-parallel attention each rank has its own KV pool of that size; its activation workspace
holds its own step's tokens, except in the MoE layers, which see every rank's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.dtypes import Precision
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.memory import ACTIVATION_BYTES, LOGIT_BYTES, MemoryPlan, plan_memory, with_state
from servesim.model_spec import ModelSpec, ceil_div
from servesim.parallelism import Parallelism, StageLayers, stages_of

GIB = 2**30
MOE_DP_CHUNK_TOKENS = 256
"""Tokens per DP rank that vLLM feeds through the MoE layers at once (``VLLM_MOE_DP_CHUNK_SIZE``,
default 256), which bounds the expert workspace under data-parallel attention."""


@dataclass(frozen=True)
class StageMemory:
    """One stage's GPU: its layers and its memory plan."""

    stage: StageLayers
    plan: MemoryPlan


def stage_weight_bytes(model: ModelSpec, p: Parallelism, precision: Precision, stage: StageLayers) -> float:
    """Weight bytes on one GPU of ``stage`` (see the module docstring): the same four classes as
    :meth:`ModelSpec.weight_bytes`, with the routed experts apart."""
    per_elem = precision.weight_bytes
    expert_elem = precision.expert_weight_bytes
    layers = stage.layers
    counts = model.layer_counts(stage.start, stage.stop)
    dense, moe = counts["dense"], counts["moe"]
    down_per_layer = model.mla_down_params / model.num_layers
    replica_kv = model._kv_replica_params(p.tp) * layers / model.num_layers
    sharded = float(model.attention_params_in(stage.start, stage.stop) - layers * down_per_layer
                    + dense * model.dense_mlp_params
                    + moe * model.shared_expert_params)
    experts = 0.0
    if model.moe is not None:
        experts = moe * (model.moe.num_experts / p.ep) * model.expert_params / p.moe_tp
    vocab = model.vocab_size * model.hidden_size
    sixteen_bit = float(model.norm_params_in(stage.start, stage.stop, stage.last) + moe * model.router_params)
    if stage.first:
        sixteen_bit += vocab / p.tp
    if stage.last and (not model.tie_word_embeddings or not stage.first):
        sixteen_bit += vocab / p.tp
    return ((sharded / p.tp + layers * down_per_layer + replica_kv) * per_elem + experts * expert_elem
            + sixteen_bit * 2.0)


def stage_activation_bytes(model: ModelSpec, p: Parallelism, stage: StageLayers, max_num_batched_tokens: int,
                           max_num_seqs: int, expert_imbalance: float = 1.0) -> float:
    """Peak activation workspace of ``stage`` on one GPU (as
    :func:`~servesim.memory.activation_workspace_bytes`;
    the MoE rows of the busiest expert rank count every DP rank's tokens)."""
    h, tp = model.hidden_size, p.tp
    heads = model.num_heads // tp
    if model.mla is not None:
        qkv = heads * (2 * model.q_head_dim + model.v_head_dim)
    else:
        qkv = (heads + 2 * max(1, model.num_kv_heads // tp)) * model.head_dim
    widths = 3 if model.gated_mlp else 2
    counts = model.layer_counts(stage.start, stage.stop)
    widest = max(qkv, widths * ceil_div(model.intermediate_size, tp) if counts["dense"] else 0)
    tokens = max_num_batched_tokens
    layer = tokens * widest * ACTIVATION_BYTES
    if model.moe is not None and counts["moe"]:
        # the busiest expert rank's rows: with DP ranks every rank's tokens, which vLLM feeds
        # through the experts in chunks of VLLM_MOE_DP_CHUNK_SIZE tokens per rank
        moe_tokens = tokens if p.dp == 1 else min(tokens, MOE_DP_CHUNK_TOKENS)
        rows = moe_tokens * p.dp * model.moe.top_k * expert_imbalance / p.ep
        local = ceil_div(model.moe.expert_intermediate, p.moe_tp)
        layer = max(layer, rows * (widths * local + h) * ACTIVATION_BYTES)
    logits = max_num_seqs * model.vocab_size * LOGIT_BYTES if stage.last else 0.0
    return tokens * 2 * h * ACTIVATION_BYTES + layer + logits


def stage_kv_bytes_per_token(model: ModelSpec, p: Parallelism, precision: Precision,
                             stage: StageLayers) -> float:
    per_layer = model.kv_elements_per_token_per_layer(p.tp) * precision.kv_bytes \
        + model.index_cache_bytes_per_token_per_layer
    return per_layer * model.kv_layers_in(stage.start, stage.stop)


def plan_stages(model: ModelSpec, hardware: HardwareProfile, p: Parallelism, precision: Precision,
                gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int,
                budget_rule: str = "whole_gpu") -> list[StageMemory]:
    out = []
    for stage in stages_of(model, p):
        kv = stage_kv_bytes_per_token(model, p, precision, stage)
        out.append(StageMemory(stage, MemoryPlan(
            capacity_bytes=hardware.memory.capacity_bytes, gpu_memory_utilization=gpu_memory_utilization,
            reserved_bytes=hardware.memory.reserved_bytes,
            weight_bytes=stage_weight_bytes(model, p, precision, stage),
            activation_bytes=stage_activation_bytes(model, p, stage, max_num_batched_tokens, max_num_seqs,
                                                    p.expert_imbalance),
            kv_bytes_per_token=kv if kv > 0 else 1.0, budget_rule=budget_rule)))
        state = model.linear_state_bytes(p.tp, stage.start, stage.stop)
        out[-1] = StageMemory(stage, with_state(out[-1].plan, state, max_num_seqs))
    return out


def plan_replica_memory(model: ModelSpec, hardware: HardwareProfile, p: Parallelism, precision: Precision,
                        gpu_memory_utilization: float, max_num_batched_tokens: int,
                        max_num_seqs: int, budget_rule: str = "whole_gpu") -> MemoryPlan:
    """The memory plan of the replica's tightest stage (one TP group holding every layer: exactly
    :func:`~servesim.memory.plan_memory`; ``budget_rule``: the engine's, :data:`~servesim.memory.
    BUDGET_RULES`)."""
    if p.is_single_group:
        return plan_memory(model, hardware, p.tp, precision, gpu_memory_utilization,
                           max_num_batched_tokens, max_num_seqs, budget_rule)
    stages = plan_stages(model, hardware, p, precision, gpu_memory_utilization, max_num_batched_tokens,
                         max_num_seqs, budget_rule)
    for entry in stages:
        plan = entry.plan
        if plan.kv_cache_bytes <= 0:
            need = plan.needed_bytes / GIB
            where = f"stage {entry.stage.index} (layers {entry.stage.start}-{entry.stage.stop - 1})" \
                if p.pp > 1 else "each GPU"
            raise ServesimError(
                "deployment", f"{model.name} at {p.label()} needs {need:.1f} GiB on {where} for weights "
                f"and activations but {hardware.name} offers {plan.budget_bytes / GIB:.1f} GiB",
                "raise pp, tp or ep, or quantise the weights (e.g. weights fp8)")
    return min((entry.plan for entry in stages), key=lambda plan: plan.kv_token_capacity)
