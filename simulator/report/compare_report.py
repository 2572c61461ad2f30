"""Two runs side by side (``servesim report RUN_A RUN_B``): the what-if a capacity engineer asks
after changing one thing, answered on one page.

Top: each run's deployment in one line, then a table of the headline numbers (latency
percentiles, throughput, SLO attainment and goodput, preemptions, KV peak) for A and B with B's
change against A, coloured by whether it is better (lower latency, higher throughput). Then the
latency CDFs of both runs overlaid, with the SLO limits, and throughput over time of both.
Reads only the two run folders, like the run report.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servesim.report.figures import TEMPLATE, Chart, f32
from servesim.report.format import METRICS, as_float, fmt_count, fmt_latency, fmt_pct, fmt_sig
from servesim.report.page import PlotlyJs, render_page, write_page
from servesim.report.run_data import RunData, load_run
from servesim.report.series import bin_edges, event_rate, interval_rate, thin_cdf, weighted_cdf
from servesim.report.verdict import _deployment_line

COLORS = ("#1f77b4", "#d62728")
MAX_POINTS = 2000


def _get(summary: dict[str, Any], *path: str) -> float:
    node: Any = summary
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return as_float(node)


ROWS: tuple[tuple[str, tuple[str, ...], str, bool], ...] = (
    *((f"{m.label} {stat}", (key, stat), m.unit, False)
      for key, m in METRICS.items() if key != "queueing_s" for stat in ("p50", "p90", "p99")),
    ("requests/s", ("throughput", "requests_per_s"), "req/s", True),
    ("output tokens/s", ("throughput", "output_tokens_per_s"), "tok/s", True),
    ("SLO attainment", ("slo_attainment",), "%", True),
    ("goodput", ("goodput_requests_per_s",), "req/s", True),
    ("preemptions", ("preemptions",), "", False),
    ("rejected", ("rejected",), "", False),
)
"""(label, summary path, unit, higher is better)."""


def _show(value: float, unit: str) -> str:
    if unit in ("s", "ms"):
        return fmt_latency(value, unit)
    if unit == "%":
        return fmt_pct(value)
    if unit == "":
        return fmt_count(value)
    return f"{fmt_sig(value)} {unit}"


def comparison_rows(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per headline number: A, B, B's relative change and whether it is better (None: equal or
    unknown)."""
    rows = []
    for label, path, unit, higher in ROWS:
        va, vb = _get(a, *path), _get(b, *path)
        if not (math.isfinite(va) or math.isfinite(vb)):
            continue
        change = (vb - va) / abs(va) if math.isfinite(va) and math.isfinite(vb) and va != 0 else math.nan
        better = None if not math.isfinite(change) or change == 0 else (change > 0) == higher
        rows.append({"label": label, "a": va, "b": vb, "unit": unit, "change": change, "better": better})
    return rows


def _table(a: RunData, b: RunData) -> str:
    body = []
    for row in comparison_rows(a.summary, b.summary):
        css = "" if row["better"] is None else (' class="good"' if row["better"] else ' class="bad"')
        change = "–" if not math.isfinite(row["change"]) else f"{row['change']:+.1%}"
        body.append(f"<tr><th>{escape(row['label'])}</th><td>{_show(row['a'], row['unit'])}</td>"
                    f"<td>{_show(row['b'], row['unit'])}</td><td{css}>{change}</td></tr>")
    return ('<table class="compare"><tr><th></th><th>A</th><th>B</th><th>B vs A</th></tr>'
            f"{''.join(body)}</table>")


def cdf_chart(a: RunData, b: RunData, names: tuple[str, str]) -> Chart:
    keys = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
    fig = make_subplots(rows=2, cols=2, vertical_spacing=0.16, horizontal_spacing=0.08)
    for k, (run, name, color) in enumerate(zip((a, b), names, COLORS, strict=True)):
        done = run.completed()
        for i, key in enumerate(keys):
            metric = METRICS[key]
            if key == "itl_s":
                x, cdf = weighted_cdf(run.itl_values, run.itl_counts)
            else:
                x, cdf = weighted_cdf(done[key].to_numpy(dtype=float))
            x, cdf = thin_cdf(x, cdf, MAX_POINTS)
            fig.add_trace(go.Scatter(x=f32(x * metric.scale), y=f32(cdf), mode="lines", name=name,
                                     legendgroup=name, showlegend=i == 0,
                                     line={"color": color, "shape": "hv"},
                                     hovertemplate=f"{name}: {metric.label} %{{x:.4g}} {metric.unit}, "
                                                   "%{y:.2%} ≤ this<extra></extra>"),
                          row=i // 2 + 1, col=i % 2 + 1)
            slo = (run.summary.get("slos") or {}).get(key)
            if k == 0 and isinstance(slo, int | float):
                fig.add_vline(x=slo * metric.scale, line={"dash": "dash", "color": "#999"},
                              row=i // 2 + 1, col=i % 2 + 1)
            fig.update_xaxes(title_text=f"{metric.label} ({metric.unit})", row=i // 2 + 1, col=i % 2 + 1)
            fig.update_yaxes(range=[0, 1.02], tickformat=".0%", row=i // 2 + 1, col=i % 2 + 1)
    fig.update_layout(template=TEMPLATE, height=640)
    return Chart("latency", "Latency distributions, A against B",
                 "Cumulative distributions of both runs (a curve further left is faster). TTFT, TPOT and E2E "
                 "per completed request, ITL per token. Dashed grey: run A's SLO limit.", fig, 640)


def throughput_chart(a: RunData, b: RunData, names: tuple[str, str]) -> Chart:
    fig = go.Figure()
    for run, name, color in zip((a, b), names, COLORS, strict=True):
        steps, req = run.steps, run.requests
        end = max(float((steps["start_s"] + steps["duration_s"]).max()) if len(steps) else 1.0, 1e-6)
        edges = bin_edges(0.0, end, max_bins=200)
        tokens = (event_rate(req["first_token_s"].to_numpy(float), edges)
                  + interval_rate(steps["start_s"].to_numpy(float), steps["duration_s"].to_numpy(float),
                                  steps["decode_tokens"].to_numpy(float), edges))
        centers = 0.5 * (edges[:-1] + edges[1:])
        fig.add_trace(go.Scatter(x=f32(centers), y=f32(tokens), mode="lines", name=name,
                                 line={"color": color},
                                 hovertemplate=f"{name}: t %{{x:.4g}} s, %{{y:,.0f}} output tokens/s"
                                               "<extra></extra>"))
    fig.update_xaxes(title_text="simulated time (s)")
    fig.update_yaxes(title_text="output tokens/s (all replicas)", rangemode="tozero")
    fig.update_layout(template=TEMPLATE, height=400, hovermode="x unified")
    return Chart("throughput", "Output tokens per second, A against B",
                 "Each run's output token rate in equal time bins (200 per run).", fig, 400)


def render_compare_report(a: RunData, b: RunData, plotlyjs: PlotlyJs = "inline") -> str:
    names = (f"A: {a.run_dir.name}", f"B: {b.run_dir.name}")
    header = ("<header><h1>servesim: two runs compared</h1>"
              f'<p class="sub"><b>A</b> ({escape(str(a.run_dir))}): {_deployment_line(a.summary)}</p>'
              f'<p class="sub"><b>B</b> ({escape(str(b.run_dir))}): {_deployment_line(b.summary)}</p>'
              "</header>"
              '<style>td.good { color: #1e6b34; font-weight: 600; } td.bad { color: #a50e0e; '
              'font-weight: 600; }</style>'
              f'<section class="verdict" id="verdict"><p class="note">B against A: green where B is better '
              f"(lower latency, higher throughput), red where it is worse.</p>{_table(a, b)}</section>")
    charts = [cdf_chart(a, b, names), throughput_chart(a, b, names)]
    config = (f"# A: {a.run_dir}\n{a.config_text or '(no config.resolved.yaml)'}\n"
              f"# B: {b.run_dir}\n{b.config_text or '(no config.resolved.yaml)'}")
    return render_page(f"servesim: {a.run_dir.name} vs {b.run_dir.name}", header, charts, config,
                       footer=f"servesim comparison of {a.run_dir.resolve()} and {b.run_dir.resolve()}",
                       config_name="both resolved configurations", plotlyjs=plotlyjs)


def write_compare_report(run_a: Path, run_b: Path, out: Path | None = None,
                         plotlyjs: PlotlyJs = "inline") -> Path:
    """Compare the runs in ``run_a`` and ``run_b``; default ``run_a/compare-<run_b name>.html``."""
    a, b = load_run(Path(run_a)), load_run(Path(run_b))
    target = Path(out) if out is not None else Path(run_a) / f"compare-{Path(run_b).resolve().name}.html"
    return write_page(target, render_compare_report(a, b, plotlyjs), plotlyjs)


__all__ = ["comparison_rows", "render_compare_report", "write_compare_report"]
