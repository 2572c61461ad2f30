"""Writing a capacity answer: ``capacity.json`` (everything, including every simulated rate of
every search, for plots), ``capacity.csv`` (one row per candidate, in rank order) and the
winner's launch commands (``launch-vllm.sh``, ``launch-sglang.sh``, ``launch-trtllm.sh``), each written
atomically.
Infinite or undefined latencies (a request never served) are written as ``null``, since JSON has
no infinity.

The CSV prices an output token two ways, named so they cannot be confused:
``usd_per_1m_output_tokens_at_max_rate`` is one replica set at its own highest sustainable rate;
``usd_per_1m_output_tokens_fleet`` is the fleet (sized for the target rate, or filling the GPU
budget) at the rate it serves (``fleet_rate``: the target, or the budget fleet's verified rate).
Without a target or a budget the fleet is one set at its highest rate and the two agree."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from servesim.atomic_io import atomic_write_text, make_output_dir

CSV_COLUMNS = ("rank", "candidate", "kind", "hardware", "tp", "policy", "replicas", "split", "feasible",
               "status", "max_rate", "max_rate_per_replica", "gpus", "replica_sets", "verified", "fleet_rate",
               "usd_per_gpu_hour", "usd_per_hour", "usd_per_1m_output_tokens_fleet",
               "usd_per_1m_output_tokens_at_max_rate", "on_frontier", "breaks_first", "step_bound",
               "kv_limited", "peak_kv_use", "margins", "tpot_batch", "kv_batch", "largest_decode_batch",
               "decode_batch_binding", "why")
LAUNCH_FILES = {"vllm": "launch-vllm.sh", "sglang": "launch-sglang.sh", "trtllm": "launch-trtllm.sh"}


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
    fleet = fleet_of(record)
    gpus, sets, verified = fleet["gpus"], fleet["sets"], fleet["verified"]
    usd, per_token, fleet_rate = fleet["usd_per_hour"], fleet["usd_per_1m_output_tokens"], fleet["rate"]
    passing = knee.get("passing") or {}
    margins = passing.get("margins") or {}
    return {
        "rank": record.get("rank"), "candidate": record["candidate"], "kind": record.get("kind", "colocated"),
        "hardware": record["hardware"], "tp": record["tp"], "policy": record["policy"]["name"],
        "replicas": record["replicas"], "split": _split(record),
        "feasible": record.get("feasible"), "status": search.get("status", "infeasible"),
        "max_rate": search.get("max_rate"), "max_rate_per_replica": search.get("max_rate_per_replica"),
        "gpus": gpus, "replica_sets": sets, "verified": verified, "fleet_rate": fleet_rate,
        "usd_per_gpu_hour": record.get("usd_per_gpu_hour"), "usd_per_hour": usd,
        "usd_per_1m_output_tokens_fleet": per_token,
        "usd_per_1m_output_tokens_at_max_rate": record.get("usd_per_1m_output_tokens_at_max_rate"),
        "on_frontier": record.get("on_frontier"),
        "breaks_first": knee.get("breaks_first"), "step_bound": knee.get("step_bound"),
        "kv_limited": knee.get("kv_limited"), "peak_kv_use": knee.get("peak_kv_use"),
        "margins": ";".join(f"{k}={v:.3f}" for k, v in margins.items()),
        "tpot_batch": limits.get("tpot_batch"), "kv_batch": limits.get("kv_batch"),
        "largest_decode_batch": limits.get("largest_batch"), "decode_batch_binding": limits.get("binding"),
        "why": record.get("why"),
    }


def fleet_of(record: dict[str, Any]) -> dict[str, Any]:
    """The fleet a candidate is judged by: sized for the target rate, filling the GPU budget, or
    (with neither) one replica set at its highest rate."""
    search = record.get("search", {})
    target, budget = record.get("target"), record.get("budget")
    if target is not None:
        return {"gpus": target.get("gpus"), "sets": target.get("sets"), "verified": target.get("verified"),
                "usd_per_hour": target.get("usd_per_hour"),
                "usd_per_1m_output_tokens": target.get("usd_per_1m_output_tokens"),
                "rate": target.get("rate")}
    if budget is not None:
        return {"gpus": budget.get("gpus"), "sets": budget.get("sets"), "verified": budget.get("verified"),
                "usd_per_hour": budget.get("usd_per_hour"),
                "usd_per_1m_output_tokens": budget.get("usd_per_1m_output_tokens"),
                "rate": budget.get("rate")}
    return {"gpus": record.get("gpus_per_set"), "sets": 1, "verified": None,
            "usd_per_hour": record.get("usd_per_hour_per_set"),
            "usd_per_1m_output_tokens": record.get("usd_per_1m_output_tokens_at_max_rate"),
            "rate": search.get("max_rate")}


def _split(record: dict[str, Any]) -> str | None:
    split = record.get("split")
    return f"{split['prefill']}:{split['decode']}" if split else None


def write_capacity(answer: dict[str, Any], out_dir: Path) -> None:
    make_output_dir(out_dir)
    atomic_write_text(out_dir / "capacity.json", json.dumps(json_safe(answer), indent=2) + "\n")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for record in answer["candidates"]:
        writer.writerow(json_safe(candidate_row(record)))
    atomic_write_text(out_dir / "capacity.csv", buffer.getvalue())
    launch = answer.get("launch")
    for family, name in LAUNCH_FILES.items():
        if launch and family in launch:
            header = (f"#!/bin/sh\n# servesim capacity {answer['name']}: the winner, {launch['candidate']}, "
                      f"as simulated ({launch['replica_sets']} replica set(s))\n")
            atomic_write_text(out_dir / name, header + launch[family]["text"] + "\n")
        else:
            (out_dir / name).unlink(missing_ok=True)
