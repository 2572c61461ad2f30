"""The textbook bound on a deployment's decode batch: how many sequences can decode together
before the time per output token exceeds its SLO, and how many the KV pool holds.

A decode step of ``B`` sequences over ``C`` cached tokens each takes ``step(B, C)`` seconds, and
each sequence emits one token per step, so TPOT = ``step(B, C)`` while only decodes run. The
largest batch within a TPOT limit is the largest ``B`` with ``step(B, C) <= tpot`` (the step
time grows with ``B``: the weights are read once per step and the KV reads and GEMM rows grow
with the batch). The KV pool holds ``num_blocks // ceil((C + 1) / block_size)`` such sequences
(each needs the blocks for its context plus the token it is computing), and the engine runs at
most ``max_num_seqs``. Whichever is smallest binds: *latency* (TPOT), *KV memory*, or the
engine's *max_num_seqs*.

A replica with pipeline stages or data-parallel ranks prices a decode step as its micro-batch
(every DP rank decoding ``B`` sequences) through all stages: what one of its requests waits per
token; ``B`` and the KV pool are then per scheduling unit (a virtual engine's DP rank).

This is a bound from the cost model alone: in a live system prompts joining the batch stall the
decodes (vLLM v0 runs them in separate steps), so the simulated TPOT at a given batch is higher.
"""

from __future__ import annotations

from typing import Any

from servesim.core.kv_cache import blocks_for
from servesim.cost import BOUNDS, BatchShape
from servesim.errors import ServesimError
from servesim.topology.group import ReplicaGroup

_MAX_BATCH = 1 << 20


def largest_batch_within(step_time: Any, context: int, limit_s: float) -> int:
    """Largest ``B >= 0`` with ``step_time(B, context) <= limit_s`` (exponential search, then
    bisection; ``step_time`` must grow with ``B``)."""
    if step_time(1, context) > limit_s:
        return 0
    low, high = 1, 2
    while high <= _MAX_BATCH and step_time(high, context) <= limit_s:
        low, high = high, high * 2
    if high > _MAX_BATCH:
        return _MAX_BATCH
    while high - low > 1:
        middle = (low + high) // 2
        if step_time(middle, context) <= limit_s:
            low = middle
        else:
            high = middle
    return low


def decode_batch_limits(group: ReplicaGroup, context: float, tpot_s: float | None) -> dict[str, Any]:
    """The three limits on one replica's decode batch at ``context`` cached tokens, and which
    binds (see the module docstring)."""
    cost = group.cost_model()
    limits, memory = group.limits, group.memory
    ctx = max(0, round(context))
    if ctx >= limits.max_model_len:
        raise ServesimError("decode_context", f"{ctx:,} tokens of context is beyond max_model_len "
                            f"{limits.max_model_len:,} of {group.model.name}, so no sequence decodes there",
                            f"use a context below {limits.max_model_len:,}")
    pipelined = group.parallel_cost_model() if group.runs_pipeline else None
    ranks = group.parallelism.dp

    def step_time(batch: int, c: int) -> float:
        if pipelined is not None:
            return pipelined.step_time([BatchShape.decode(batch, c)] * ranks)
        return cost.step_time(BatchShape.decode(batch, c))

    blocks_each = blocks_for(ctx + 1, limits.block_size)
    kv_batch = limits.num_blocks // blocks_each
    tpot_batch = largest_batch_within(step_time, ctx, tpot_s) if tpot_s is not None else None
    candidates = {"KV memory": kv_batch, "max_num_seqs": limits.max_num_seqs}
    if tpot_batch is not None:
        candidates["latency (TPOT)"] = tpot_batch
    # Ties go to latency, then KV: the physical limits before the configured one.
    order = ["latency (TPOT)", "KV memory", "max_num_seqs"]
    binding = min((name for name in order if name in candidates), key=lambda name: candidates[name])
    largest = candidates[binding]
    out: dict[str, Any] = {
        "context_tokens": ctx,
        "tpot_limit_s": tpot_s,
        "tpot_batch": tpot_batch,
        "kv_batch": kv_batch,
        "max_num_seqs": limits.max_num_seqs,
        "largest_batch": largest,
        "binding": binding,
        "kv_bytes_per_token_per_gpu": memory.kv_bytes_per_token,
        "kv_bytes_per_token": memory.kv_bytes_per_token * group.tp * group.parallelism.pp,
        "kv_pool_tokens_per_gpu": memory.kv_token_capacity,
        "kv_pool_bytes_per_gpu": memory.kv_cache_bytes,
        "kv_blocks": limits.num_blocks,
        "block_size": limits.block_size,
    }
    if tpot_batch:
        at = BatchShape.decode(tpot_batch, ctx)
        if pipelined is not None:
            priced = pipelined.price([at] * ranks)
            record = priced.ranks[0]
            assert record is not None
            out["step_at_tpot_batch_s"] = priced.time_s
            out["bound_at_tpot_batch"] = BOUNDS[record.bound]
        else:
            step = cost.step(at)
            out["step_at_tpot_batch_s"] = step.time_s
            out["bound_at_tpot_batch"] = step.bound
        out["kv_use_at_tpot_batch"] = tpot_batch * blocks_each / max(1, limits.num_blocks)
        if tpot_batch < _MAX_BATCH:
            out["step_one_more_s"] = step_time(tpot_batch + 1, ctx)
    return out


def describe_limits(limits: dict[str, Any]) -> str:
    """One sentence: the numbers and which limit binds."""
    ctx = limits["context_tokens"]
    parts = []
    if limits["tpot_batch"] is not None:
        parts.append(f"TPOT <= {limits['tpot_limit_s'] * 1e3:g} ms allows {limits['tpot_batch']:,}")
    parts.append(f"the KV pool holds {limits['kv_batch']:,}")
    parts.append(f"max_num_seqs {limits['max_num_seqs']:,}")
    text = (f"decode batch at {ctx:,} tokens of context: " + ", ".join(parts)
            + f" -> largest {limits['largest_batch']:,}, limited by {limits['binding']}")
    if limits.get("kv_use_at_tpot_batch") is not None and 0 < limits["tpot_batch"] <= limits["kv_batch"]:
        text += f" (at the TPOT batch the KV pool is {limits['kv_use_at_tpot_batch']:.0%} full)"
    return text
