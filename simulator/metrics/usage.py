"""How busy a group of replicas was: KV blocks, batches, host swap traffic (summary sections)."""

from __future__ import annotations

from typing import Any

from servesim.core.replica_state import ReplicaState
from servesim.metrics.columns import Table, column
from servesim.metrics.stats import weighted_average


def kv_usage(states: list[ReplicaState], steps: Table) -> dict[str, Any]:
    """KV figures of replicas with equal pools: the pool size, the peak any of them used, what is
    still held at the end (0 unless something leaked), and the mean use weighted by step time."""
    pools = [state.pool for state in states]
    out: dict[str, Any] = {"blocks_total": pools[0].total, "block_size": pools[0].block_size,
                           "peak_blocks_used": max(p.peak_used for p in pools),
                           "blocks_in_use_at_end": sum(p.used for p in pools)}
    weights = column(steps, "duration_s")
    if len(steps) and weights.sum():
        out["mean_utilization"] = weighted_average(column(steps, "kv_blocks_used"), weights,
                                                   column(steps, "kv_blocks_total"))
    else:
        out["mean_utilization"] = 0.0
    return out


def swap_usage(states: list[ReplicaState]) -> dict[str, Any]:
    """KV swapped to and from host memory (preemption_mode swap); zeros when nothing swaps.
    Bytes are summed over every GPU's host link; ``transfer_s`` is the step time they added."""
    swaps = [state.swap for state in states if state.swap is not None]
    return {"swaps_out": sum(s.swaps_out for s in swaps), "swaps_in": sum(s.swaps_in for s in swaps),
            "bytes_out": sum(s.bytes(s.blocks_out) for s in swaps),
            "bytes_in": sum(s.bytes(s.blocks_in) for s in swaps),
            "transfer_s": sum(s.transfer_s for s in swaps),
            "host_blocks_total": sum(s.pool.total for s in swaps),
            "host_blocks_in_use_at_end": sum(s.pool.used for s in swaps)}


def batch_usage(steps: Table) -> dict[str, Any]:
    """Steps, their time-weighted mean batch size, how many carried a prefill, total busy time."""
    if not len(steps):
        return {"steps": 0, "mean_size": 0.0, "prefill_steps": 0, "busy_s": 0.0}
    weights = column(steps, "duration_s")
    busy = float(weights.sum())
    return {"steps": len(steps),
            "mean_size": weighted_average(column(steps, "batch_size"), weights),
            "prefill_steps": int((column(steps, "num_prefills") > 0).sum()),
            "busy_s": busy}
