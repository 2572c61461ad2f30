"""Writing a capacity answer: ``capacity.json`` (everything, including every simulated rate of
every search, for plots) and ``capacity.csv`` (one row per candidate, in rank order), each
written atomically. Infinite or undefined latencies (a request never served) are written as
``null``, since JSON has no infinity."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from servesim.atomic_io import atomic_write_text, make_output_dir

CSV_COLUMNS = ("rank", "candidate", "hardware", "tp", "policy", "replicas", "feasible", "status",
               "max_rate", "max_rate_per_replica", "gpus", "replica_sets", "verified", "usd_per_gpu_hour",
               "usd_per_hour", "usd_per_1m_output_tokens", "on_frontier", "breaks_first", "step_bound",
               "kv_limited", "peak_kv_use", "margins", "tpot_batch", "kv_batch", "largest_decode_batch",
               "decode_batch_binding", "why")


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def candidate_row(record: dict[str, Any]) -> dict[str, Any]:
    """The flat row of one candidate, shared by the CSV and the printed table."""
    search = record.get("search", {})
    knee = record.get("knee", {})
    limits = record.get("decode_batch_limits", {})
    target = record.get("target")
    if target is not None:
        gpus, sets = target.get("gpus"), target.get("sets")
        usd, per_token = target.get("usd_per_hour"), target.get("usd_per_1m_output_tokens")
        verified = target.get("verified")
    else:
        gpus, sets, verified = record.get("gpus_per_set"), 1, None
        usd = record.get("usd_per_hour_per_set")
        per_token = record.get("usd_per_1m_output_tokens_at_max_rate")
    passing = knee.get("passing") or {}
    margins = passing.get("margins") or {}
    return {
        "rank": record.get("rank"), "candidate": record["candidate"], "hardware": record["hardware"],
        "tp": record["tp"], "policy": record["policy"]["name"], "replicas": record["replicas"],
        "feasible": record.get("feasible"), "status": search.get("status", "infeasible"),
        "max_rate": search.get("max_rate"), "max_rate_per_replica": search.get("max_rate_per_replica"),
        "gpus": gpus, "replica_sets": sets, "verified": verified,
        "usd_per_gpu_hour": record.get("usd_per_gpu_hour"), "usd_per_hour": usd,
        "usd_per_1m_output_tokens": per_token, "on_frontier": record.get("on_frontier"),
        "breaks_first": knee.get("breaks_first"), "step_bound": knee.get("step_bound"),
        "kv_limited": knee.get("kv_limited"), "peak_kv_use": knee.get("peak_kv_use"),
        "margins": ";".join(f"{k}={v:.3f}" for k, v in margins.items()),
        "tpot_batch": limits.get("tpot_batch"), "kv_batch": limits.get("kv_batch"),
        "largest_decode_batch": limits.get("largest_batch"), "decode_batch_binding": limits.get("binding"),
        "why": record.get("why"),
    }


def write_capacity(answer: dict[str, Any], out_dir: Path) -> None:
    make_output_dir(out_dir)
    atomic_write_text(out_dir / "capacity.json", json.dumps(json_safe(answer), indent=2) + "\n")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for record in answer["candidates"]:
        writer.writerow(json_safe(candidate_row(record)))
    atomic_write_text(out_dir / "capacity.csv", buffer.getvalue())
