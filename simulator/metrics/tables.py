"""The per-request table and the summary every report, sweep and test reads.

Definitions (those of vLLM's ``benchmark_serving``, per request):
TTFT = first token - arrival; TPOT = (finish - first token) / (output tokens - 1), undefined for
one-token outputs; ITL = the gap between consecutive output tokens (a distribution over all
tokens); E2E = finish - arrival; queueing delay = first scheduled - arrival. Throughput divides by
the span from the first arrival to the last completion (or the last arrival, if later).
``unfinished`` counts requests neither completed nor rejected when the run ended: always 0 for the
built-in policies (a test holds them to it), reported rather than hidden for new ones.
With SLOs, attainment is the fraction of *all* requests (rejected ones count as misses) that
complete within every limit given, and goodput is those requests per second (DistServe's
definition).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from servesim.engine.simulation import SimulationResult
from servesim.engine.state import DONE, REJECT_REASONS, REJECTED, STATUS_NAMES, UNFINISHED_NAME
from servesim.metrics.disaggregation import add_request_columns, disaggregation_summary, pool_kv_summary
from servesim.metrics.stats import describe, describe_weighted

SUMMARY_LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queueing_s")


def request_frame(result: SimulationResult) -> pd.DataFrame:
    r = result.requests
    status = np.asarray(STATUS_NAMES, dtype=object)[r.status]
    status[(r.status != DONE) & (r.status != REJECTED)] = UNFINISHED_NAME
    output = r.output
    tpot = np.full(len(r), np.nan)
    multi = (output > 1) & np.isfinite(r.finish)
    tpot[multi] = (r.finish[multi] - r.first_token[multi]) / (output[multi] - 1)
    frame = pd.DataFrame({
        "request_id": np.arange(len(r), dtype=np.int64),
        "replica": r.replica,
        "arrival_s": r.arrival,
        "prompt_tokens": r.prompt,
        "output_tokens": output,
        "priority": r.table.priority,
        "status": status,
        "reject_reason": np.asarray(REJECT_REASONS, dtype=object)[r.reject_reason],
        "first_scheduled_s": r.first_scheduled,
        "first_token_s": r.first_token,
        "finish_s": r.finish,
        "preemptions": r.preemptions,
        "swaps_out": r.swaps_out,
        "swaps_in": r.swaps_in,
        "cached_tokens": r.cached_tokens,
        "queueing_s": r.first_scheduled - r.arrival,
        "ttft_s": r.first_token - r.arrival,
        "tpot_s": tpot,
        "max_itl_s": r.max_itl,
        "e2e_s": r.finish - r.arrival,
    })
    if result.pools is not None:  # disaggregated: ``replica`` is the prefill replica
        add_request_columns(result, frame)
    return frame


def itl_frame(result: SimulationResult) -> pd.DataFrame:
    values, counts = result.requests.itl.arrays()
    return pd.DataFrame({"itl_s": values, "count": counts})


def slo_met(requests: pd.DataFrame, limits: dict[str, float]) -> np.ndarray:
    """Per request: completed and within every limit (a one-token output has no TPOT to miss)."""
    met = (requests["status"] == "completed").to_numpy().copy()
    for key, limit in limits.items():
        values = requests[key].to_numpy()
        within = values <= limit
        if key == "tpot_s":
            within |= np.isnan(values)
        met &= within
    return met


def summarise(result: SimulationResult, requests: pd.DataFrame, itl: pd.DataFrame,
              steps: pd.DataFrame) -> dict[str, Any]:
    completed = requests["status"] == "completed"
    start = float(requests["arrival_s"].min()) if len(requests) else 0.0
    last_arrival = float(requests["arrival_s"].max()) if len(requests) else 0.0
    end = max(float(requests.loc[completed, "finish_s"].max()) if completed.any() else start,
              last_arrival)
    span = max(end - start, 1e-12)
    done = requests[completed]
    summary: dict[str, Any] = {key: describe(done[key].to_numpy())
                               for key in SUMMARY_LATENCIES if key != "itl_s"}
    summary["itl_s"] = describe_weighted(itl["itl_s"].to_numpy(), itl["count"].to_numpy())
    summary = {key: summary[key] for key in SUMMARY_LATENCIES}
    summary["throughput"] = {
        "requests_per_s": len(done) / span,
        "output_tokens_per_s": float(done["output_tokens"].sum()) / span,
        "total_tokens_per_s": float((done["prompt_tokens"] + done["output_tokens"]).sum()) / span,
    }
    summary["completed"] = int(completed.sum())
    summary["rejected"] = int((requests["status"] == "rejected").sum())
    summary["unfinished"] = int((requests["status"] == UNFINISHED_NAME).sum())
    summary["preemptions"] = int(requests["preemptions"].sum())
    slo = result.config.slo
    limits = slo.limits() if slo else {}
    if limits:
        met = slo_met(requests, limits)
        summary["slo_attainment"] = float(met.mean()) if len(requests) else None
        summary["goodput_requests_per_s"] = float(met.sum()) / span
    else:
        summary["slo_attainment"] = summary["goodput_requests_per_s"] = None
    summary["slos"] = limits or None
    summary["duration_s"] = span
    summary["num_requests"] = len(requests)
    summary["offered_rate"] = result.workload.mean_rate
    deployment = result.deployment.describe()
    deployment["policy"] = result.config.policy.name
    deployment["router"] = result.config.router.name
    summary["deployment"] = deployment
    if result.pools is None:
        summary["kv"] = _kv_summary(result, steps)
    else:  # the decode pool's KV is the colocated figure's counterpart; each pool's is below
        decode = [s for s, p in zip(result.replica_states, result.pools, strict=True) if p == "decode"]
        summary["kv"] = pool_kv_summary(decode, steps[steps["pool"] == "decode"])
    summary["swap"] = _swap_summary(result)
    summary["batch"] = _batch_summary(steps)
    if result.pools is not None:
        summary["disaggregation"] = disaggregation_summary(result, requests, steps, span)
    summary["prefix_cache"] = _prefix_cache_summary(result, requests)
    return summary


def _prefix_cache_summary(result: SimulationResult, requests: pd.DataFrame) -> dict[str, Any] | None:
    """Hit rate = prompt tokens found cached at each request's first admission / prompt tokens
    of the admitted requests (vLLM's prefix-cache hit rate, in tokens; recomputes after a
    preemption are not counted again). None when prefix caching is off."""
    caches = [getattr(state, "prefix_cache", None) for state in result.replica_states]
    if not caches or any(c is None for c in caches):
        return None
    admitted = requests["first_scheduled_s"].notna()
    prompt = int(requests.loc[admitted, "prompt_tokens"].sum())
    cached = int(requests.loc[admitted, "cached_tokens"].sum())
    return {"hit_rate": cached / prompt if prompt else 0.0, "cached_tokens": cached, "prompt_tokens": prompt,
            "evicted_blocks": sum(c.evicted_blocks for c in caches if c is not None),
            "cached_blocks_at_end": sum(c.cached_blocks for c in caches if c is not None),
            "workload_has_prefixes": result.workload.has_prefixes}


def _kv_summary(result: SimulationResult, steps: pd.DataFrame) -> dict[str, Any]:
    limits = result.deployment.limits
    pools = [state.pool for state in result.replica_states]
    out: dict[str, Any] = {"blocks_total": limits.num_blocks, "block_size": limits.block_size,
                           "peak_blocks_used": max(p.peak_used for p in pools),
                           "blocks_in_use_at_end": sum(p.used for p in pools)}
    if len(steps):
        weights = steps["duration_s"].to_numpy()
        use = steps["kv_blocks_used"].to_numpy() / limits.num_blocks
        out["mean_utilization"] = float(np.average(use, weights=weights)) if weights.sum() else 0.0
    else:
        out["mean_utilization"] = 0.0
    return out


def _swap_summary(result: SimulationResult) -> dict[str, Any]:
    """KV swapped to and from host memory (preemption_mode swap); zeros when nothing swaps.
    Bytes are summed over every GPU's host link; ``transfer_s`` is the step time they added."""
    swaps = [state.swap for state in result.replica_states if state.swap is not None]
    return {"swaps_out": sum(s.swaps_out for s in swaps), "swaps_in": sum(s.swaps_in for s in swaps),
            "bytes_out": sum(s.bytes(s.blocks_out) for s in swaps),
            "bytes_in": sum(s.bytes(s.blocks_in) for s in swaps),
            "transfer_s": sum(s.transfer_s for s in swaps),
            "host_blocks_total": sum(s.pool.total for s in swaps),
            "host_blocks_in_use_at_end": sum(s.pool.used for s in swaps)}


def _batch_summary(steps: pd.DataFrame) -> dict[str, Any]:
    if not len(steps):
        return {"steps": 0, "mean_size": 0.0, "prefill_steps": 0, "busy_s": 0.0}
    weights = steps["duration_s"].to_numpy()
    busy = float(weights.sum())
    return {"steps": len(steps),
            "mean_size": float(np.average(steps["batch_size"].to_numpy(), weights=weights)),
            "prefill_steps": int((steps["num_prefills"] > 0).sum()),
            "busy_s": busy}
