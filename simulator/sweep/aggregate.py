"""From run folders to tables: ``points.parquet`` (one row per run) and ``results.parquet`` (one
row per point, its replications aggregated).

Each numeric leaf of a run's ``summary.json`` (except the ``deployment`` section, which restates
the config, and the vLLM-named keys, which restate the metrics in other units) becomes a column
named by its dotted path (``ttft_s.p99``, ``throughput.requests_per_s``,
``slo_attainment``...). Across a point's K replications, ``<metric>`` is the mean and
``<metric>.ci95`` the half-width of the 95% confidence interval of that mean,
``t(0.975, K-1) * s / sqrt(K)`` with ``s`` the sample standard deviation (Student's t, since
K is small; 0 when K = 1). A null leaf (e.g. TPOT with no completed request) is NaN.

The Student t quantile is computed here, without SciPy: for an integer number of degrees of
freedom the two-sided t probability has a closed form (Abramowitz & Stegun 26.7.3-4), which
bisection inverts to 1e-12; t(0.975, 2) = 4.303, t(0.975, 1) = 12.706, as in every t table.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servesim.metrics.benchmark_names import is_benchmark_key
from servesim.sweep.execute import RUN_RECORD
from servesim.sweep.plan import SweepPlan

FIXED_COLUMNS = ("gpus", "hardware", "model", "policy.name", "cost_per_hour")
SKIPPED_SECTIONS = ("deployment",)


# ---------------------------------------------------------------------- statistics
def t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (a positive integer) degrees of freedom."""
    theta = math.atan(t / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2:  # odd: (2/pi) (theta + sin(theta) (cos + 2/3 cos^3 + 2*4/(3*5) cos^5 + ...))
        total, term = 0.0, c
        for j in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c * c * (2 * j) / (2 * j + 1)
        return 2 / math.pi * (theta + s * total)
    total, term = 0.0, 1.0  # even: sin(theta) (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for j in range(1, df // 2 + 1):
        total += term
        term *= c * c * (2 * j - 1) / (2 * j)
    return s * total


@lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1 (got p={p}, df={df})")
    coverage = 2 * p - 1
    lo, hi = 0.0, 1.0
    while t_two_sided(hi, df) < coverage:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided(mid, df) < coverage:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


def ci95_halfwidth(values: np.ndarray) -> float:
    """Half-width of the 95% confidence interval of the mean of ``values`` (0 for one value)."""
    k = len(values)
    if k < 2:
        return 0.0
    return t_quantile(0.975, k - 1) * float(np.std(values, ddof=1)) / math.sqrt(k)


# ---------------------------------------------------------------------- summaries
def flatten_metrics(summary: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a summary as ``{"ttft_s.p99": 0.16, ...}``; null leaves become NaN."""
    flat: dict[str, float] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if not prefix and (key in SKIPPED_SECTIONS or is_benchmark_key(key)):
            continue  # the deployment restates the config; vLLM's names restate the metrics
        if isinstance(value, dict):
            flat.update(flatten_metrics(value, f"{name}."))
        elif value is None:
            flat[name] = math.nan
        elif isinstance(value, int | float) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat


def read_run(folder: Path) -> tuple[dict[str, Any], dict[str, float]]:
    record = json.loads((folder / RUN_RECORD).read_text())
    summary_path = folder / "summary.json"
    metrics = flatten_metrics(json.loads(summary_path.read_text())) if summary_path.is_file() else {}
    return record, metrics


# ---------------------------------------------------------------------- tables
def tables(plan: SweepPlan, points_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(``points`` per run, ``results`` per point), rows in the sweep's point order."""
    run_rows: list[dict[str, Any]] = []
    result_rows: list[dict[str, Any]] = []
    metric_names: dict[str, None] = {}  # first-seen order, stable across runs of the sweep
    per_point: list[tuple[dict[str, Any], list[dict[str, float]]]] = []
    for point in plan.points:
        fixed = _fixed_columns(point)
        varied = dict(point.values)
        status, reason = point.status, point.reason
        ok_metrics: list[dict[str, float]] = []
        for task in point.runs:
            record, metrics = read_run(points_dir / task.run_id)
            if record["status"] != "ok" and status == "ok":
                status, reason = record["status"], record["reason"]
            metric_names.update(dict.fromkeys(metrics))
            run_rows.append({"point": point.point_id, "run": task.run_id, "replication": task.replication,
                             "seed": task.seed, "status": record["status"], "reason": record["reason"],
                             **varied, **fixed, **metrics})
            if record["status"] == "ok":
                ok_metrics.append(metrics)
        row = {"point": point.point_id, "status": status, "reason": reason, **varied,
               "replications": len(ok_metrics) if status == "ok" else 0, **fixed}
        per_point.append((row, ok_metrics if status == "ok" else []))
    for row, runs in per_point:
        for name in metric_names:
            values = np.array([m.get(name, math.nan) for m in runs], dtype=float)
            row[name] = float(values.mean()) if len(values) else math.nan
            row[f"{name}.ci95"] = ci95_halfwidth(values) if len(values) else math.nan
        result_rows.append(row)
    return _frame(run_rows, plan.keys), _frame(result_rows, plan.keys)


def _fixed_columns(point: Any) -> dict[str, Any]:
    config = point.config
    price = getattr(point.hardware, "cost_per_gpu_hour", None)
    return {"gpus": point.gpus, "hardware": config.hardware, "model": config.model,
            "policy.name": config.policy.name,
            "cost_per_hour": float(price * point.gpus) if price is not None else math.nan}


def _frame(rows: list[dict[str, Any]], varied: list[str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for key in varied:
        if key in frame and frame[key].dtype == object and _mixed(frame[key]):
            frame[key] = frame[key].map(lambda v: None if v is None else str(v))  # one parquet type
    if "replications" in frame:
        frame["replications"] = frame["replications"].astype("int64")
    return frame


def _mixed(column: pd.Series) -> bool:
    kinds = {type(v) for v in column if v is not None}
    return len(kinds) > 1 or bool(kinds & {list, dict})
