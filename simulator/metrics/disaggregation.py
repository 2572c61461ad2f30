"""What a disaggregated run adds to the tables: transfer times per request, and per pool and link
figures in ``summary.json`` (key ``disaggregation``).

Per request: ``prefill_end_s`` (prompt KV complete on the prefill replica), ``transfer_queued_s``
(the decode replica reserved blocks and asked for the link), ``transfer_start_s`` /
``transfer_end_s`` (the copy itself). So ``decode_wait_s = queued - prefill_end`` is the wait for
decode-side room, ``link_wait_s = start - queued`` the queue on the link, ``transfer_s = end -
start`` the copy. Link utilisation is busy channel-seconds over ``channels x`` the run's span.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from servesim.engine.simulation import SimulationResult
from servesim.metrics.stats import describe

REQUEST_COLUMNS = ("decode_replica", "prefill_end_s", "transfer_queued_s", "transfer_start_s",
                   "transfer_end_s")


def add_request_columns(result: SimulationResult, frame: pd.DataFrame) -> None:
    r = result.requests
    values = (r.decode_replica, r.prefill_end, r.transfer_queued, r.transfer_start, r.transfer_end)
    for name, column in zip(REQUEST_COLUMNS, values, strict=True):
        frame[name] = column


def pool_kv_summary(states: list[Any], steps: pd.DataFrame) -> dict[str, Any]:
    """KV figures of one pool's replicas (same keys as the colocated ``kv`` section)."""
    pools = [state.pool for state in states]
    out: dict[str, Any] = {"blocks_total": pools[0].total, "block_size": pools[0].block_size,
                           "peak_blocks_used": max(p.peak_used for p in pools),
                           "blocks_in_use_at_end": sum(p.used for p in pools)}
    weights = steps["duration_s"].to_numpy()
    if len(steps) and weights.sum():
        use = steps["kv_blocks_used"].to_numpy() / steps["kv_blocks_total"].to_numpy()
        out["mean_utilization"] = float(np.average(use, weights=weights))
    else:
        out["mean_utilization"] = 0.0
    return out


def disaggregation_summary(result: SimulationResult, requests: pd.DataFrame, steps: pd.DataFrame,
                           span: float) -> dict[str, Any]:
    deployment = result.deployment
    described = deployment.describe()["pools"]  # type: ignore[index]
    pools: dict[str, Any] = {}
    for name in ("prefill", "decode"):
        mine = steps[steps["pool"] == name]
        states = [s for s, p in zip(result.replica_states, result.pools or [], strict=True) if p == name]
        busy = float(mine["duration_s"].sum())
        pools[name] = {**described[name], "steps": len(mine), "busy_s": busy,
                       "busy_fraction": busy / (len(states) * span) if span > 0 else 0.0,
                       "kv": pool_kv_summary(states, mine)}
    link = result.link
    moved = requests[np.isfinite(requests["transfer_end_s"].to_numpy())]
    return {
        "pools": pools,
        "link": {**link.spec.describe(), "transfers": link.transfers, "bytes": link.bytes,
                 "busy_s": link.busy_s,
                 "utilization": link.busy_s / (link.spec.channels * span) if span > 0 else 0.0},
        "kv_bytes_per_token": deployment.kv_bytes_per_token,  # type: ignore[attr-defined]
        "decode_wait_s": describe((moved["transfer_queued_s"] - moved["prefill_end_s"]).to_numpy()),
        "link_wait_s": describe((moved["transfer_start_s"] - moved["transfer_queued_s"]).to_numpy()),
        "transfer_s": describe((moved["transfer_end_s"] - moved["transfer_start_s"]).to_numpy()),
    }
