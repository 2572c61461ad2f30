"""The HTML report of a sweep: which points meet the SLOs and the best point per objective first,
then the load curves, heatmaps and the cost/latency frontier.

Usable from the CLI (``servesim report SWEEP_DIR``) and from a notebook::

    from servesim.report.sweep_report import write_sweep_report
    write_sweep_report(Path("sweeps/rates-h100"))   # -> sweeps/rates-h100/report.html

It reads only ``results.parquet`` (and ``sweep.resolved.yaml`` when present), so it can be rebuilt
from an archived sweep.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.report.format import METRICS, fmt_count, fmt_latency, fmt_pct, fmt_sig
from servesim.report.page import PlotlyJs, render_page, write_page
from servesim.report.sweep_data import RESOLVED_FILE, RESULTS_FILE, SweepData, format_value, load_sweep
from servesim.report.sweep_figures import build_sweep_charts

REPORT_FILE = "report.html"
__all__ = ["RESULTS_FILE", "render_sweep_report", "write_sweep_report"]


@dataclass(frozen=True)
class Objective:
    """A way to pick the best point: a value per point and whether higher wins."""

    label: str
    value: Callable[[SweepData, pd.DataFrame], np.ndarray]
    higher_is_better: bool
    show: Callable[[float], str]
    needs_slos: bool = True  # chosen among the points meeting the SLOs (when any are set)


def _col(name: str) -> Callable[[SweepData, pd.DataFrame], np.ndarray]:
    return lambda data, frame: (
        pd.to_numeric(frame[name], errors="coerce").to_numpy(float)
        if name in frame
        else np.full(len(frame), np.nan)
    )


def _per_gpu(name: str) -> Callable[[SweepData, pd.DataFrame], np.ndarray]:
    return lambda data, frame: _col(name)(data, frame) / _col("gpus")(data, frame)


def _dollars_per_million_tokens(data: SweepData, frame: pd.DataFrame) -> np.ndarray:
    tokens_per_hour = _col("throughput.output_tokens_per_s")(data, frame) * 3600
    return _col("cost_per_hour")(data, frame) / tokens_per_hour * 1e6


OBJECTIVES = (
    Objective("highest goodput", _col("goodput_requests_per_s"), True, lambda v: f"{fmt_sig(v)} req/s"),
    Objective("highest throughput", _col("throughput.requests_per_s"), True, lambda v: f"{fmt_sig(v)} req/s"),
    Objective(
        "highest throughput per GPU",
        _per_gpu("throughput.requests_per_s"),
        True,
        lambda v: f"{fmt_sig(v)} req/s/GPU",
    ),
    Objective(
        "lowest $ per million output tokens", _dollars_per_million_tokens, False, lambda v: f"${fmt_sig(v)}"
    ),
    Objective("fewest GPUs", _col("gpus"), False, lambda v: fmt_count(v)),
    Objective("lowest p99 TTFT", _col("ttft_s.p99"), False, lambda v: fmt_latency(v, "s"), needs_slos=False),
    Objective("lowest p99 TPOT", _col("tpot_s.p99"), False, lambda v: fmt_latency(v, "ms"), needs_slos=False),
)


def best_points(data: SweepData) -> list[tuple[Objective, pd.Series | None, float]]:
    """Per objective, the winning point (None when no point qualifies) and its value."""
    ok = data.ok
    out: list[tuple[Objective, pd.Series | None, float]] = []
    for objective in OBJECTIVES:
        pool = ok[ok["meets"]] if data.slos and objective.needs_slos else ok
        values = objective.value(data, pool)
        finite = np.flatnonzero(np.isfinite(values))
        if objective.label == "highest goodput" and not data.slos:
            continue
        if not finite.size:
            if np.isfinite(objective.value(data, ok)).any():  # the metric exists, nothing qualifies
                out.append((objective, None, math.nan))
            continue
        pick = finite[np.argmax(values[finite]) if objective.higher_is_better else np.argmin(values[finite])]
        out.append((objective, pool.iloc[pick], float(values[pick])))
    return out


def _config_cell(row: pd.Series, axes: list[str]) -> str:
    parts = [f"{escape(a)} = <b>{escape(format_value(row[a]))}</b>" for a in axes] or [
        escape(str(row["point"]))
    ]
    return ", ".join(parts)


def _slo_sentence(data: SweepData) -> str:
    if not data.slos:
        return "no SLOs set"
    return " and ".join(
        f"p99 {METRICS[k].label} ≤ {fmt_latency(v, METRICS[k].unit)}" for k, v in data.slos.items()
    )


def _banner(data: SweepData) -> str:
    total, ok = len(data.frame), len(data.ok)
    infeasible = total - ok
    ran = f"{ok} of {total} point(s) ran" + (f", {infeasible} infeasible" if infeasible else "")
    if not data.slos:
        return f'<div class="banner neutral">{ran}. No SLOs set: throughput and latency only.</div>'
    meeting = int(data.frame["meets"].sum())
    css = "good" if meeting else "bad"
    return (
        f'<div class="banner {css}">{meeting} of {total} point(s) meet the SLOs '
        f"({escape(_slo_sentence(data))}); {ran}.</div>"
    )


def _best_table(data: SweepData) -> str:
    rows = []
    for objective, row, value in best_points(data):
        among = "points meeting the SLOs" if data.slos and objective.needs_slos else "points that ran"
        if row is None:
            rows.append(
                f"<tr><th>{escape(objective.label)}</th><td>–</td>"
                f'<td class="config">none of the {among}</td></tr>'
            )
            continue
        rows.append(
            f"<tr><th>{escape(objective.label)}</th><td>{escape(objective.show(value))}</td>"
            f'<td class="config">{_config_cell(row, data.axes)} '
            f'<span class="note">(point {escape(str(row["point"]))})</span></td></tr>'
        )
    if not rows:
        return ""
    return (
        '<h2>Best point per objective</h2><table class="best"><tr><th>objective</th><th>value</th>'
        f"<th>point</th></tr>{''.join(rows)}</table>"
    )


def _ci(value: float, ci: float, show: Callable[[float], str]) -> str:
    text = show(value)
    if math.isfinite(ci) and ci > 0 and math.isfinite(value):
        text += f' <span class="note">± {show(ci)}</span>'
    return text


WIDE_CI_METRICS = (("ttft_s.p99", "p99 TTFT"), ("tpot_s.p99", "p99 TPOT"), ("e2e_s.p99", "p99 E2E"),
                   ("throughput.requests_per_s", "req/s"), ("goodput_requests_per_s", "goodput req/s"))
"""Metrics whose 95% interval is checked against their mean (see :func:`wide_intervals`)."""


def wide_intervals(data: SweepData) -> list[tuple[pd.Series, list[str]]]:
    """Points where a metric's 95% confidence half-width exceeds its mean: the replications
    disagree, as they do near the knee, where one seed's queue builds and another's does not."""
    out = []
    for _, row in data.ok.iterrows():
        wide = [label for column, label in WIDE_CI_METRICS
                if _num(row, f"{column}.ci95") > abs(_num(row, column)) > 0]
        if wide:
            out.append((row, wide))
    return out


def _ci_warning(data: SweepData) -> str:
    wide = wide_intervals(data)
    if not wide:
        return ""
    items = "".join(f"<li>{_config_cell(row, data.axes)}: {escape(', '.join(labels))}</li>"
                    for row, labels in wide[:12])
    more = f"<li>and {len(wide) - 12} more</li>" if len(wide) > 12 else ""
    return ('<div class="ciwarn"><p><b>Uncertain near the knee:</b> at these points a 95% interval is '
            "wider than its mean, so the replications disagree (one seed's queue builds, another's does "
            "not). Do not read a verdict from them: rerun those points with more requests "
            "(<code>workload.num_requests</code>) or more <code>replications</code>.</p>"
            f'<ul class="warnings">{items}{more}</ul></div>')


WIDE_CELL = ' class="wide" title="95% interval wider than the mean"'


def _points_table(data: SweepData) -> str:
    frame = data.frame
    columns: list[tuple[str, str, Callable[[float], str]]] = [
        ("throughput.requests_per_s", "req/s", fmt_sig),
        ("goodput_requests_per_s", "goodput req/s", fmt_sig),
        ("slo_attainment", "attainment", fmt_pct),
        ("ttft_s.p99", "p99 TTFT", lambda v: fmt_latency(v, "s")),
        ("tpot_s.p99", "p99 TPOT", lambda v: fmt_latency(v, "ms")),
        ("gpus", "GPUs", fmt_count),
        ("cost_per_hour", "$/hour", fmt_sig),
    ]
    columns = [
        c for c in columns if c[0] in frame and pd.to_numeric(frame[c[0]], errors="coerce").notna().any()
    ]
    shown_axes = [a for a in data.axes if not (a == "policy.name" and "policy" in data.axes)]
    head = f"<th>{escape(' · '.join(shown_axes) or 'point')}</th>"
    head += "<th>verdict</th>" + "".join(f"<th>{label}</th>" for _, label, _ in columns)
    wide = {str(row["point"]): labels for row, labels in wide_intervals(data)}
    body = []
    for _, row in frame.iterrows():
        config = " · ".join(format_value(row[a]) for a in shown_axes) or str(row["point"])
        cells = f'<td class="config">{escape(config)}</td>'
        if row["status"] != "ok":
            verdict = (
                f'<td class="bad" title="{escape(row["reason"])}">{escape(row["status"])}: '
                f"{escape(row['reason'][:80])}</td>"
            )
        elif not data.slos:
            verdict = "<td>ran</td>"
        else:
            verdict = (
                '<td class="good">meets</td>'
                if row["meets"]
                else f'<td class="bad">{_misses(data, row)}</td>'
            )
        flagged = set(wide.get(str(row["point"]), []))
        values = "".join(
            f"<td{WIDE_CELL if label in flagged else ''}>"
            f"{_ci(_num(row, c), _num(row, f'{c}.ci95'), show)}</td>"
            for c, label, show in columns
        )
        body.append(f"<tr>{cells}{verdict}{values}</tr>")
    return (
        f'<h2>All points</h2><p class="note">Means over replications, ± the 95% confidence half-width '
        "(shaded where it is wider than the mean). Sorted by the varied keys.</p>"
        f'<div class="scroll"><table class="points"><tr>{head}</tr>'
        f"{''.join(body)}</table></div>"
    )


def _num(row: pd.Series, column: str) -> float:
    try:
        return float(row[column]) if column in row.index else math.nan
    except (TypeError, ValueError):
        return math.nan


def _misses(data: SweepData, row: pd.Series) -> str:
    missed = [f"{METRICS[k].label}" for k, limit in data.slos.items() if not _num(row, f"{k}.p99") <= limit]
    return "misses " + ", ".join(missed) if missed else "misses"


def render_header(data: SweepData) -> str:
    frame = data.frame
    fixed = []
    for column, label in (("model", "model"), ("hardware", "hardware"), ("policy.name", "policy")):
        if column in frame and column not in data.axes:
            fixed.append(f"{label} {escape(format_value(frame[column].iloc[0]))}")
    axes = ", ".join(f"<b>{escape(a)}</b> ({frame[a].nunique()} values)" for a in data.axes) or "nothing"
    reps = pd.to_numeric(frame.get("replications", pd.Series([1])), errors="coerce")
    return (
        f'<header><h1>servesim sweep report</h1><p class="sub">{escape(data.sweep_dir.name)}: '
        f"{len(frame)} point(s){', ' + ', '.join(fixed) if fixed else ''}; "
        f"up to {fmt_count(float(reps.max()))} replication(s) per point</p>"
        f'<p class="sub">varied: {axes}</p></header>'
        f'<section class="verdict" id="verdict">{_banner(data)}{_ci_warning(data)}{_best_table(data)}'
        f"{_points_table(data)}</section>"
    )


SWEEP_CSS = """<style>
.scroll { max-height: 420px; overflow: auto; border: 1px solid #eee; }
table.points td { white-space: nowrap; } table.points td.good, table.points td.bad { text-align: left; }
table.points td.config { white-space: normal; text-align: left; min-width: 12em; max-width: 26em; }
table.points th:first-child { text-align: left; } table.points td.wide { background: #fff3cd; }
.ciwarn { background: #fff8e1; border-left: 4px solid #f9a825; padding: 4px 12px; margin: 12px 0; }
td.good { color: #1e6b34; } td.bad { color: #a50e0e; }
table.best td.config { text-align: left; } table.best th { text-align: left; }
</style>"""


def render_sweep_report(data: SweepData, plotlyjs: PlotlyJs = "inline") -> str:
    title = f"servesim sweep: {data.sweep_dir.name}"
    return render_page(
        title,
        SWEEP_CSS + render_header(data),
        build_sweep_charts(data),
        data.config_text,
        footer=f"servesim sweep report for {data.sweep_dir.resolve()}",
        config_name=RESOLVED_FILE,
        plotlyjs=plotlyjs,
    )


def write_sweep_report(sweep_dir: Path, out: Path | None = None, plotlyjs: PlotlyJs = "inline") -> Path:
    """Read ``sweep_dir/results.parquet`` and write ``sweep_dir/report.html`` (or ``out``)."""
    sweep_dir = Path(sweep_dir)
    data = load_sweep(sweep_dir)
    target = Path(out) if out is not None else sweep_dir / REPORT_FILE
    return write_page(target, render_sweep_report(data, plotlyjs), plotlyjs)
