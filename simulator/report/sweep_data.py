"""Load a sweep folder's ``results.parquet`` and work out what varied, what the SLOs were, and
which points meet them.

The contract with the sweep runner is the table alone: one row per point, each varied key as a
column named by its dotted path, each summary metric as ``<metric>`` (mean over replications)
and ``<metric>.ci95`` (95% CI half-width), plus ``point``, ``replications``, ``gpus``,
``hardware``, ``model``, ``policy.name``, ``status``/``reason`` and maybe ``cost_per_hour``. The
varied keys are read from the table itself (config columns whose value differs between rows), so
the report does not depend on the schema of ``sweep.resolved.yaml``; that file only orders the
axes when it names them, and supplies the SLOs when the table has no ``slos.*`` columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from servesim.errors import ServesimError
from servesim.inputs.files import load_yaml_text, read_text
from servesim.report.format import METRICS, format_value

RESULTS_FILE = "results.parquet"
RESOLVED_FILE = "sweep.resolved.yaml"
RATE_KEY = "workload.arrival.rate"
RESERVED = ("point", "status", "reason", "replications", "gpus", "cost_per_hour")
"""Columns that describe a point but are not axes: ``gpus`` follows from tp x replicas and
``cost_per_hour`` from gpus x price."""
SLO_KEYS = tuple(k for k, m in METRICS.items() if m.request_column is not None)  # ttft, tpot, itl, e2e


@dataclass(frozen=True)
class SweepData:
    sweep_dir: Path
    frame: pd.DataFrame  # every point; ``meets`` and ``config_text`` columns added
    axes: list[str]  # the varied keys, in the sweep's order
    rate_axis: str | None  # the arrival-rate axis, when one varied
    slos: dict[str, float]  # metric key -> limit (seconds); empty when the sweep set none
    config_text: str | None

    @property
    def ok(self) -> pd.DataFrame:
        """The points that ran (infeasible ones have no metrics)."""
        return self.frame[self.frame["status"] == "ok"]

    @property
    def cost_column(self) -> str:
        """``cost_per_hour`` where every price is known, else ``gpus`` (nothing derived)."""
        cost = self.frame.get("cost_per_hour")
        if cost is not None and np.isfinite(pd.to_numeric(cost, errors="coerce")).all():
            return "cost_per_hour"
        return "gpus"

    def metric(self, name: str) -> np.ndarray:
        """A metric column of every point as floats (NaN where absent)."""
        if name not in self.frame:
            return np.full(len(self.frame), np.nan)
        return pd.to_numeric(self.frame[name], errors="coerce").to_numpy(dtype=float)


def _read(sweep_dir: Path) -> pd.DataFrame:
    path = sweep_dir / RESULTS_FILE
    if not sweep_dir.is_dir():
        raise ServesimError("sweep_dir", f"{sweep_dir} is not a directory", "pass a sweep's output folder")
    if not path.is_file():
        raise ServesimError(
            "sweep_dir",
            f"{RESULTS_FILE} not found in {sweep_dir}",
            "run the sweep first (its folder holds results.parquet)",
        )
    try:
        frame = pq.read_table(path).to_pandas()
    except Exception as exc:  # pyarrow raises several types for a corrupt or non-Parquet file
        raise ServesimError(
            "sweep_dir",
            f"{RESULTS_FILE} is not a readable Parquet file ({exc})",
            "re-run the sweep to rewrite it",
        ) from exc
    missing = [c for c in ("point",) if c not in frame]
    if missing or not len(frame):
        raise ServesimError(
            "sweep_dir",
            f"{RESULTS_FILE} has " + (f"no column {missing[0]}" if missing else "no rows"),
            "re-run the sweep with this version of servesim",
        )
    if "status" not in frame:
        frame["status"] = "ok"
    if "reason" not in frame:
        frame["reason"] = ""
    frame["status"] = frame["status"].fillna("ok").astype(str)
    frame["reason"] = frame["reason"].fillna("").astype(str)
    return frame.reset_index(drop=True)


def metric_columns(frame: pd.DataFrame) -> set[str]:
    """Every ``<metric>`` with a ``<metric>.ci95`` partner, and the partners."""
    names = {c[: -len(".ci95")] for c in frame.columns if c.endswith(".ci95")}
    return names | {f"{n}.ci95" for n in names}


def _varies(column: pd.Series) -> bool:
    values = column.dropna().map(lambda v: repr(v) if isinstance(v, list | dict | np.ndarray) else v)
    return values.nunique() > 1


def _yaml_document(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return load_yaml_text(text, RESOLVED_FILE, "sweep_dir")
    except ServesimError:  # only orders the axes and supplies SLOs: the table alone still reports
        return None


def _named_keys(document: Any) -> list[str]:
    """Dotted keys a sweep file lists under ``grid``/``zip``/``random``/``axes`` (any of them)."""
    found: list[str] = []
    if not isinstance(document, dict):
        return found
    for section in ("axes", "grid", "zip", "random"):
        part = document.get(section)
        if isinstance(part, dict):
            found.extend(str(k) for k in part)
        elif isinstance(part, list):
            for item in part:
                if isinstance(item, str):
                    found.append(item)
                elif isinstance(item, dict):
                    found.extend([str(item["key"])] if "key" in item else [str(k) for k in item])
    return found


def find_axes(frame: pd.DataFrame, document: Any = None) -> list[str]:
    """The varied keys: non-metric, non-reserved columns whose value differs between points,
    ordered as the sweep file names them, then in column order."""
    metrics = metric_columns(frame)
    candidates = [c for c in frame.columns if c not in metrics and c not in RESERVED and _varies(frame[c])]
    named = [k for k in _named_keys(document) if k in candidates]
    return list(dict.fromkeys([*named, *candidates]))


def find_rate_axis(frame: pd.DataFrame, axes: list[str]) -> str | None:
    """``workload.arrival.rate``, else a numeric axis whose name ends in ``rate``."""
    numeric = [a for a in axes if pd.api.types.is_numeric_dtype(frame[a])]
    if RATE_KEY in numeric:
        return RATE_KEY
    return next((a for a in numeric if a.rsplit(".", 1)[-1].endswith("rate")), None)


def _slos_in(document: Any) -> dict[str, float]:
    """The first ``slo`` mapping found anywhere in the sweep file (its base experiment's)."""
    if isinstance(document, dict):
        slo = document.get("slo")
        if isinstance(slo, dict):
            limits = {k: float(v) for k, v in slo.items() if k in SLO_KEYS and isinstance(v, int | float)}
            if limits:
                return limits
        for value in document.values():
            found = _slos_in(value)
            if found:
                return found
    elif isinstance(document, list):
        for value in document:
            found = _slos_in(value)
            if found:
                return found
    return {}


def find_slos(frame: pd.DataFrame, document: Any) -> dict[str, float]:
    """SLO limits from the runs' own summaries (``slos.<metric>`` columns), else the sweep file."""
    limits = {}
    for key in SLO_KEYS:
        column = f"slos.{key}"
        if column in frame:
            values = pd.to_numeric(frame[column], errors="coerce").dropna()
            if len(values):
                limits[key] = float(values.max())
    return limits or _slos_in(document)


def meets_slos(frame: pd.DataFrame, slos: dict[str, float]) -> np.ndarray:
    """Per point: ran, and every SLO's metric p99 within its limit (the run report's rule).

    A point whose summaries carry their own ``slos.<metric>`` limit is judged on it; others on
    the sweep-wide limit. Without SLOs, nothing "meets" (the table says no SLO was set)."""
    ok = (frame["status"] == "ok").to_numpy()
    if not slos:
        return np.zeros(len(frame), dtype=bool)
    meets = ok.copy()
    for key, limit in slos.items():
        p99 = pd.to_numeric(
            frame.get(f"{key}.p99", pd.Series(np.nan, index=frame.index)), errors="coerce"
        ).to_numpy(float)
        own = frame.get(f"slos.{key}")
        limits = (
            np.where(
                np.isfinite(pd.to_numeric(own, errors="coerce")), pd.to_numeric(own, errors="coerce"), limit
            )
            if own is not None
            else np.full(len(frame), limit)
        )
        meets &= p99 <= limits
    return meets


def config_text(frame: pd.DataFrame, axes: list[str]) -> list[str]:
    """Per point: its varied keys as ``key = value`` lines (HTML line breaks, for hovers)."""
    keys = axes or ["point"]
    return ["<br>".join(f"{k} = {format_value(row[k])}" for k in keys) for _, row in frame[keys].iterrows()]


def _optional_text(path: Path) -> str | None:
    """A file the report can do without: its text, or None when missing or unreadable."""
    try:
        return read_text(path, "sweep_dir") if path.is_file() else None
    except ServesimError:
        return None


def load_sweep(sweep_dir: Path) -> SweepData:
    sweep_dir = Path(sweep_dir)
    frame = _read(sweep_dir)
    resolved = sweep_dir / RESOLVED_FILE
    text = _optional_text(resolved)
    document = _yaml_document(text)
    axes = find_axes(frame, document)
    slos = find_slos(frame, document)
    frame["meets"] = meets_slos(frame, slos)
    frame["config_text"] = config_text(frame, axes)
    sort_keys = [a for a in axes if a != RATE_KEY] + [a for a in axes if a == RATE_KEY]
    try:
        if sort_keys:
            frame = frame.sort_values(sort_keys, kind="stable", na_position="last").reset_index(drop=True)
    except TypeError:  # an axis mixing numbers and strings: keep the sweep's own order
        pass
    return SweepData(sweep_dir, frame, axes, find_rate_axis(frame, axes), slos, text)
