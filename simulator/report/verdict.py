"""The top of the run report: what ran, and whether it met its targets.

A reader should get the answer before any chart: the deployment and workload in one line each, a
banner that says meets/misses, one sentence per SLO that names the statistic compared with the
limit and the margin, then the key metrics table. The SLO convention follows the summary: each SLO
is a latency limit; the run meets it when the metric's p99 is within the limit, and per-request
attainment is the fraction of requests whose own values are within every limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any

import numpy as np

from servesim.metrics.stats import weighted_percentile
from servesim.report.format import (
    METRICS,
    MISSING,
    Metric,
    as_float,
    fmt_count,
    fmt_latency,
    fmt_pct,
    fmt_rate,
    fmt_sig,
)
from servesim.report.run_data import RunData

TABLE_STATS = (("mean", "mean"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("max", "max"))


@dataclass(frozen=True)
class SloCheck:
    """One SLO: the run's p99 of a metric against its limit."""

    metric: Metric
    limit_s: float
    p99_s: float
    within_fraction: float  # of completed requests whose own value is within the limit; NaN if none

    @property
    def known(self) -> bool:
        return math.isfinite(self.p99_s)

    @property
    def meets(self) -> bool:
        return self.known and self.p99_s <= self.limit_s

    def sentence(self) -> str:
        """E.g. ``p99 TTFT 1.42 s ≤ 2.00 s: meets, 29% margin``."""
        m = self.metric
        limit = fmt_latency(self.limit_s, m.unit)
        if not self.known:
            return f"p99 {m.label} {MISSING} vs {limit}: no data"
        value = fmt_latency(self.p99_s, m.unit)
        if self.limit_s <= 0:
            return f"p99 {m.label} {value} {'≤' if self.meets else '>'} {limit}: " + (
                "meets" if self.meets else "misses")
        if self.meets:
            margin = (self.limit_s - self.p99_s) / self.limit_s
            return f"p99 {m.label} {value} ≤ {limit}: meets, {margin:.0%} margin"
        over = (self.p99_s - self.limit_s) / self.limit_s
        if over >= 1.0:  # "misses by 204674%" reads worse than a ratio
            return f"p99 {m.label} {value} > {limit}: misses, {fmt_sig(self.p99_s / self.limit_s)}× the limit"
        return f"p99 {m.label} {value} > {limit}: misses by {over:.0%}"


def _stat(summary: dict[str, Any], key: str, stat: str) -> float:
    block = summary.get(key)
    return as_float(block.get(stat)) if isinstance(block, dict) else math.nan


def _p99_from_data(data: RunData, metric: Metric) -> float:
    """Fallback when the summary lacks a p99: compute it from the saved distributions, as the
    summary does (completed requests, linear interpolation)."""
    if metric.key == "itl_s":
        return float(weighted_percentile(data.itl_values, data.itl_counts, 99.0))
    if metric.key not in data.requests:
        return math.nan
    return float(weighted_percentile(data.completed()[metric.key].to_numpy(dtype=float), None, 99.0))


def _within_fraction(data: RunData, metric: Metric, limit_s: float) -> float:
    """Share of completed requests whose own value is within the limit (NaN, e.g. TPOT of a
    one-token output, has nothing to violate and counts as within)."""
    completed = data.completed()
    if metric.request_column is None or not len(completed):
        return math.nan
    values = completed[metric.request_column].to_numpy(dtype=float)
    return float(np.mean(~(values > limit_s)))


def slo_checks(data: RunData) -> list[SloCheck]:
    """One check per SLO in the summary, in the order TTFT, TPOT, ITL, E2E."""
    slos = data.summary.get("slos")
    if not isinstance(slos, dict):
        return []
    checks = []
    for key, metric in METRICS.items():
        limit = as_float(slos.get(key))
        if not math.isfinite(limit):
            continue
        p99 = _stat(data.summary, key, "p99")
        if not math.isfinite(p99):
            p99 = _p99_from_data(data, metric)
        checks.append(SloCheck(metric, limit, p99, _within_fraction(data, metric, limit)))
    return checks


def _deployment_line(summary: dict[str, Any]) -> str:
    d = summary.get("deployment") or {}
    hardware = escape(str(d.get("hardware", MISSING)))
    tp = d.get("tp")
    parts = [
        f"<b>{escape(str(d.get('model', MISSING)))}</b>",
        f"{hardware} × TP {escape(str(tp))}" if tp is not None else hardware,
        f"{fmt_count(d.get('replicas'))} replica(s)",
        f"policy {escape(str(d.get('policy', MISSING)))}",
        f"precision {escape(str(d.get('precision', MISSING)))}",
    ]
    return " · ".join(parts)


def _workload_line(data: RunData) -> str:
    s = data.summary
    num = s.get("num_requests", len(data.requests))
    return (f"{fmt_count(num)} requests offered at {fmt_rate(s.get('offered_rate'), 'req/s')} "
            f"over {fmt_sig(s.get('duration_s'))} s simulated")


def _banner(checks: list[SloCheck]) -> str:
    if not checks:
        return '<div class="banner neutral">No SLOs set for this run: latency and throughput only.</div>'
    missed = [c.metric.label for c in checks if c.known and not c.meets]
    unknown = [c.metric.label for c in checks if not c.known]
    if missed:
        return (f'<div class="banner bad">Misses {len(missed)} of {len(checks)} SLO(s) at p99: '
                f'{", ".join(missed)}.</div>')
    if unknown:
        return (f'<div class="banner neutral">{len(unknown)} of {len(checks)} SLO(s) cannot be checked '
                f'(no data): {", ".join(unknown)}.</div>')
    return f'<div class="banner good">Meets all {len(checks)} SLO(s) at p99.</div>'


def _slo_block(data: RunData, checks: list[SloCheck]) -> str:
    if not checks:
        return ""
    items = []
    for c in checks:
        css = "good" if c.meets else "bad" if c.known else "unknown"
        within = ("" if not math.isfinite(c.within_fraction) else
                  f' <span class="note">({fmt_pct(c.within_fraction)} of completed requests within '
                  f'the limit{" on their worst ITL" if c.metric.key == "itl_s" else ""})</span>')
        items.append(f'<li class="{css}">{escape(c.sentence())}{within}</li>')
    limits = " and ".join(f"{c.metric.label} ≤ {fmt_latency(c.limit_s, c.metric.unit)}" for c in checks)
    s = data.summary
    attainment = (f"<p><b>SLO attainment {fmt_pct(s.get('slo_attainment'))}</b>: the fraction of requests "
                  f"whose own latencies meet all SLOs ({escape(limits)}). "
                  f"<b>Goodput {fmt_rate(s.get('goodput_requests_per_s'), 'req/s')}</b>: such requests "
                  "per second of simulated time.</p>")
    return ("<p>Each SLO compares the run's p99 of the metric with its limit; the margin is the "
            "distance to the limit as a share of the limit.</p>"
            f'<ul class="slos">{"".join(items)}</ul>{attainment}')


def _metrics_table(summary: dict[str, Any]) -> str:
    head = "".join(f"<th>{label}</th>" for _, label in TABLE_STATS)
    rows = []
    for key, m in METRICS.items():
        cells = "".join(f"<td>{fmt_latency(_stat(summary, key, stat), m.unit)}</td>"
                        for stat, _ in TABLE_STATS)
        rows.append(f"<tr><th>{m.label}</th>{cells}</tr>")
    return f'<table class="metrics"><tr><th>latency</th>{head}</tr>{"".join(rows)}</table>'


def _throughput_table(data: RunData) -> str:
    s = data.summary
    tp = s.get("throughput") or {}
    kv = s.get("kv") or {}
    unfinished = int((data.requests["status"] == "unfinished").sum())
    pairs = [
        ("requests/s", fmt_rate(tp.get("requests_per_s"), "req/s")),
        ("output tokens/s", fmt_rate(tp.get("output_tokens_per_s"), "tok/s")),
        ("total tokens/s", fmt_rate(tp.get("total_tokens_per_s"), "tok/s")),
        ("completed", fmt_count(s.get("completed"))),
        ("rejected", fmt_count(s.get("rejected"))),
        ("unfinished", fmt_count(unfinished)),
        ("preemptions", fmt_count(s.get("preemptions"))),
        ("KV blocks", f"{fmt_count(kv.get('blocks_total'))} × {fmt_count(kv.get('block_size'))} tokens"),
        ("KV peak use", _kv_peak(kv)),
        ("KV mean use", fmt_pct(kv.get("mean_utilization"))),
    ]
    cells = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in pairs)
    return f'<table class="kv">{cells}</table>'


def _kv_peak(kv: dict[str, Any]) -> str:
    peak, total = as_float(kv.get("peak_blocks_used")), as_float(kv.get("blocks_total"))
    if not (math.isfinite(peak) and math.isfinite(total) and total > 0):
        return fmt_count(peak)
    return f"{fmt_count(peak)} blocks ({fmt_pct(peak / total)})"


def _warnings(data: RunData) -> str:
    notes = []
    req = data.requests
    rejected = req[req["status"] == "rejected"]
    if len(rejected):
        reasons = rejected["reject_reason"].replace("", "unspecified").value_counts()
        listed = ", ".join(f"{escape(str(r))}: {n:,}" for r, n in reasons.items())
        notes.append(f"{len(rejected):,} request(s) rejected ({listed}); their latencies are excluded.")
    unfinished = int((req["status"] == "unfinished").sum())
    if unfinished:
        notes.append(f"{unfinished:,} request(s) were still in flight when the run ended.")
    if not notes:
        return ""
    return '<ul class="warnings">' + "".join(f"<li>{n}</li>" for n in notes) + "</ul>"


def render_header(data: RunData, checks: list[SloCheck]) -> str:
    """The verdict section: deployment, workload, SLO verdict, key metrics."""
    return (
        '<header>'
        f'<h1>servesim run report</h1><p class="sub">{_deployment_line(data.summary)}</p>'
        f'<p class="sub">{_workload_line(data)}</p></header>'
        f'<section class="verdict">{_banner(checks)}{_slo_block(data, checks)}{_warnings(data)}'
        f'<div class="tables">{_metrics_table(data.summary)}{_throughput_table(data)}</div></section>'
    )
