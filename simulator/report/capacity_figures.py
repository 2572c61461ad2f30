"""The capacity report's charts: each candidate's search (where and why it breaks) and the cost
of every candidate's fleet against its tail latency, with the Pareto frontier.

**Search curves.** Every rate the search simulated, against the percentile latencies it judged
(TTFT and TPOT, log scale, the SLO limit dashed) and the share of requests meeting every limit.
Filled markers passed, crosses failed; the hover names the step of the search (first guess,
bracket, bisection). The dotted vertical line is the highest passing rate: the answer. A menu
picks the candidate (the winner first). A latency that is infinite (a request never served) is
drawn at the top of the panel as a triangle.

**Cost against latency.** One point per candidate: its fleet's price per million output tokens
(GPUs when no price is known) against the fleet's percentile latency, with the frontier of the
candidates no other beats on both. The "why" table beside it says what stops each one.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servesim.report.capacity_data import (
    LATENCY_KEYS,
    CapacityData,
    fleet_cost,
    fleet_latencies,
    search_phases,
)
from servesim.report.figures import TEMPLATE, Chart
from servesim.report.format import METRICS
from servesim.report.sweep_figures import pareto_front

COLORS = TEMPLATE.layout.colorway
CAP_FACTOR = 3.0
"""Infinite or very large latencies are drawn at this multiple of the SLO limit (log panel top)."""


def _panels(data: CapacityData) -> list[str]:
    """The latency panels: the metrics with a limit, TTFT and TPOT at least."""
    keys = [k for k in LATENCY_KEYS if k in data.limits]
    return keys or ["ttft_s", "tpot_s"]


def _candidate_traces(data: CapacityData, record: dict[str, Any], panels: list[str], visible: bool
                      ) -> list[tuple[go.Scatter, int]]:
    """(trace, row) pairs of one candidate's search: one line per panel plus the answer line."""
    evaluations = sorted(record["search"]["evaluations"], key=lambda e: e["rate"])
    order = record["search"]["evaluations"]
    phases = dict(zip((e["rate"] for e in order), search_phases(order), strict=True))
    rates = np.array([e["rate"] for e in evaluations], dtype=float)
    passed = np.array([bool(e["passed"]) for e in evaluations])
    step = np.array([order.index(e) + 1 for e in evaluations])
    phase = np.array([phases[e["rate"]] for e in evaluations], dtype=object)
    symbols = np.where(passed, "circle", "x")
    out: list[tuple[go.Scatter, int]] = []
    for row, key in enumerate(panels, start=1):
        metric = METRICS[key]
        limit = data.limits.get(key)
        raw = np.array([_num(e["metrics"].get(data.metric_key(key))) for e in evaluations])
        cap = (limit or np.nanmax(np.where(np.isfinite(raw), raw, np.nan), initial=1.0)) * CAP_FACTOR
        shown = np.where(np.isfinite(raw), np.minimum(raw, cap), cap)
        marker_symbols = np.where(np.isfinite(raw) & (raw <= cap), symbols, "triangle-up")
        text = [f"{'∞ (a request never served)' if not math.isfinite(v) else _fmt(v, metric.unit)}"
                if "stopped_early" not in e else f"≥ {_fmt(v, metric.unit)} (stopped once certain to fail)"
                for v, e in zip(raw, evaluations, strict=True)]
        custom = np.column_stack([step, phase, np.where(passed, "passed", "failed"), text])
        out.append((go.Scatter(
            x=rates, y=shown * metric.scale, mode="lines+markers", name=record["candidate"],
            legendgroup=str(record["index"]), showlegend=False, visible=visible,
            line={"color": "#1f77b4", "width": 1}, marker={"symbol": marker_symbols.tolist(), "size": 10,
                                                             "color": np.where(passed, "#1e6b34",
                                                                               "#a50e0e").tolist()},
            customdata=custom,
            hovertemplate=(f"rate %{{x:.4g}} req/s: p{data.percentile:g} {metric.label} %{{customdata[3]}}"
                           "<br>step %{customdata[0]} (%{customdata[1]}): %{customdata[2]}<extra></extra>"),
        ), row))
    attainment = np.array([_num(e.get("attainment")) for e in evaluations]) * 100
    out.append((go.Scatter(
        x=rates, y=attainment, mode="lines+markers", name=record["candidate"], showlegend=False,
        visible=visible, line={"color": "#1f77b4", "width": 1},
        marker={"symbol": symbols.tolist(), "size": 10,
                "color": np.where(passed, "#1e6b34", "#a50e0e").tolist()},
        customdata=np.column_stack([step, phase]),
        hovertemplate="rate %{x:.4g} req/s: %{y:.2f}% of requests within every limit"
                      "<br>step %{customdata[0]} (%{customdata[1]})<extra></extra>"), len(panels) + 1))
    best = record["search"]["max_rate"]
    if best and best > 0:
        for row in range(1, len(panels) + 2):
            out.append((go.Scatter(
                x=[best, best], y=[0, 1], yaxis=None, mode="lines", showlegend=False, visible=visible,
                line={"color": "#555", "dash": "dot", "width": 1}, hoverinfo="skip",
                name="highest passing rate"), row))
    return out


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.inf


def _fmt(seconds: float, unit: str) -> str:
    return f"{seconds * (1e3 if unit == 'ms' else 1):.4g} {unit}"


def search_chart(data: CapacityData) -> Chart:
    """Each candidate's simulated rates against the judged latencies and attainment."""
    title = "The search: where each candidate breaks"
    records = data.searched
    if not records:
        return Chart("search", title, "No feasible candidate was searched.", None, 0)
    panels = _panels(data)
    rows = len(panels) + 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.06)
    buttons = []
    trace_owner: list[int] = []
    for k, record in enumerate(records):
        for trace, row in _candidate_traces(data, record, panels, visible=k == 0):
            fig.add_trace(trace, row=row, col=1)
            trace_owner.append(k)
    # The answer lines span each panel: y in paper-free data units is unknown before drawing, so
    # they use each row's own y range, set from the data below.
    for row, key in enumerate(panels, start=1):
        metric = METRICS[key]
        limit = data.limits.get(key)
        if limit is not None:
            fig.add_hline(y=limit * metric.scale, line={"dash": "dash", "color": "#d62728"}, row=row, col=1)
            # On a log axis an annotation's y is log10 of the value (plotly's convention), which
            # add_hline's own annotation does not apply.
            axis = "" if row == 1 else str(row)
            fig.add_annotation(x=0, xref=f"x{axis} domain", xanchor="left",
                               y=math.log10(limit * metric.scale), yref=f"y{axis}", yanchor="bottom",
                               text=f"SLO {_fmt(limit, metric.unit)}", showarrow=False,
                               font={"color": "#d62728"})
        fig.update_yaxes(title_text=f"p{data.percentile:g} {metric.label} ({metric.unit})", type="log",
                         row=row, col=1)
    target = data.slo.get("attainment")
    if target is not None:
        fig.add_hline(y=float(target) * 100, line={"dash": "dash", "color": "#d62728"},
                      annotation_text=f"target {float(target):.1%}", row=rows, col=1)
    fig.update_yaxes(title_text="within every limit (%)", range=[0, 102], row=rows, col=1)
    fig.update_xaxes(title_text="arrival rate of one replica set (req/s)", row=rows, col=1)
    _stretch_answer_lines(fig, panels, data)
    for k, record in enumerate(records):
        buttons.append({"label": f"{record.get('rank')}. {record['candidate']}", "method": "update",
                        "args": [{"visible": [owner == k for owner in trace_owner]}]})
    fig.update_layout(template=TEMPLATE, height=260 * rows, margin={"t": 70}, hovermode="closest",
                      updatemenus=[{"buttons": buttons, "direction": "down", "x": 0.0, "xanchor": "left",
                                    "y": 1.0 + 60 / (260 * rows), "yanchor": "bottom",
                                    "showactive": True}])
    search = data.answer["search"]
    caption = (f"Every rate the search simulated for one replica set ({search['replications']} "
               f"replication(s) of {search['requests_per_run']} requests each), against the "
               f"p{data.percentile:g} latencies it judged (log scale; dashed red: the SLO) and the share of "
               "requests within every limit. Green circles passed, red crosses failed, triangles are "
               "off the scale (a request never served counts as infinite). The search starts from the "
               "cost model's saturation rate, halves or doubles until one rate passes and the next "
               "fails (bracket), then bisects; the dotted line is the answer, the highest passing rate. "
               "Pick the candidate in the menu.")
    return Chart("search", title, caption, fig, 260 * rows)


def _stretch_answer_lines(fig: go.Figure, panels: list[str], data: CapacityData) -> None:
    """Give each vertical answer line the y span of its panel's data (log panels: 0 is not
    drawable, so the line runs from the smallest to the largest value shown)."""
    spans: dict[str, tuple[float, float]] = {}
    for trace in fig.data:
        if trace.name == "highest passing rate" or trace.y is None:
            continue
        axis = trace.yaxis or "y"
        ys = np.asarray(trace.y, dtype=float)
        ys = ys[np.isfinite(ys) & (ys > 0)]
        if ys.size:
            lo, hi = spans.get(axis, (math.inf, 0.0))
            spans[axis] = (min(lo, float(ys.min())), max(hi, float(ys.max())))
    for row, key in enumerate(panels, start=1):
        limit = data.limits.get(key)
        axis = "y" if row == 1 else f"y{row}"
        if limit is not None:
            lo, hi = spans.get(axis, (limit, limit))
            spans[axis] = (min(lo, limit * METRICS[key].scale), max(hi, limit * METRICS[key].scale))
    last = f"y{len(panels) + 1}"
    spans[last] = (0.0, 100.0)
    for trace in fig.data:
        if trace.name == "highest passing rate":
            lo, hi = spans.get(trace.yaxis or "y", (0.0, 1.0))
            trace.y = [lo, hi]


def _why_table(data: CapacityData) -> str:
    rows = []
    for record in data.candidates:
        knee = record.get("knee") or {}
        reason = record.get("why") or ""
        first = knee.get("breaks_first") or ("infeasible" if not record.get("feasible") else "–")
        cells = (f"<td>{escape(str(record.get('rank')))}</td><td>{escape(record['candidate'])}</td>"
                 f"<td>{escape(first)}</td><td>{escape(reason)}</td>")
        rows.append(f"<tr>{cells}</tr>")
    return ('<table class="why"><tr><th>#</th><th>candidate</th><th>breaks first</th><th>why</th></tr>'
            f"{''.join(rows)}</table>")


def cost_latency_chart(data: CapacityData) -> Chart:
    """Each candidate's fleet cost against its tail latency, the Pareto frontier highlighted."""
    title = "Cost against latency, and why the losers lose"
    records = [r for r in data.searched if r["search"]["max_rate"] > 0]
    if not records:
        return Chart("cost", title, "No candidate met the SLOs at any rate, so there is no cost to compare.",
                     None, 0, aside=_why_table(data))
    per_token = np.array([fleet_cost(r)[1] for r in records])
    priced = bool(np.isfinite(per_token).all())
    if priced:
        x, x_label = per_token, "$ per 1M output tokens (fleet, at the rate it serves)"
    else:
        x = np.array([float((r.get("target") or r.get("budget") or {}).get("gpus") or r["gpus_per_set"])
                      for r in records])
        x_label = "GPUs (no price for every candidate)"
    panels = _panels(data)
    fig = go.Figure()
    titles: list[str] = []
    visibility: list[int] = []
    labels = np.array([f"{r.get('rank')}. {r['candidate']}" for r in records], dtype=object)
    for k, key in enumerate(panels):
        metric = METRICS[key]
        y = np.array([fleet_latencies(r, data)[key] for r in records]) * metric.scale
        front = pareto_front(x, y)
        custom = np.column_stack([labels, [r.get("why", "") for r in records]])
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="markers+text", text=[str(r.get("rank")) for r in records],
            textposition="top center", name="candidates", visible=k == 0, customdata=custom,
            marker={"size": 11, "color": "#1f77b4", "opacity": 0.7},
            hovertemplate=(f"<b>%{{customdata[0]}}</b><br>{x_label} %{{x:.4g}}<br>p{data.percentile:g} "
                           f"{metric.label} %{{y:.4g}} {metric.unit}<extra></extra>")))
        fig.add_trace(go.Scatter(
            x=x[front], y=y[front], mode="lines+markers", name="Pareto frontier", visible=k == 0,
            customdata=custom[front], line={"color": "#d62728", "width": 2},
            marker={"size": 13, "color": "#d62728", "symbol": "diamond"},
            hovertemplate=(f"<b>on the frontier: %{{customdata[0]}}</b><br>{x_label} %{{x:.4g}}<br>"
                           f"p{data.percentile:g} {metric.label} %{{y:.4g}} {metric.unit}<extra></extra>")))
        visibility += [k, k]
        limit = data.limits.get(key)
        axis_title = f"p{data.percentile:g} {metric.label} ({metric.unit})" + (
            f", SLO {_fmt(limit, metric.unit)}" if limit else "")
        titles.append(axis_title)
    buttons = [{"label": f"p{data.percentile:g} {METRICS[key].label}", "method": "update",
                "args": [{"visible": [v == k for v in visibility]}, {"yaxis.title.text": titles[k]}]}
               for k, key in enumerate(panels)]
    first = panels[0]
    limit = data.limits.get(first)
    fig.update_xaxes(title_text=x_label)
    fig.update_yaxes(title_text=f"p{data.percentile:g} {METRICS[first].label} ({METRICS[first].unit})"
                     + (f", SLO {_fmt(limit, METRICS[first].unit)}" if limit else ""))
    fig.update_layout(template=TEMPLATE, height=460, margin={"t": 80},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
                      updatemenus=[{"buttons": buttons, "direction": "down", "x": 1.0, "xanchor": "right",
                                    "y": 1.15, "yanchor": "top"}])
    if data.mode == "target":
        where = f"at the target {data.answer['target_rate']:g} req/s"
    elif data.mode == "budget":
        where = f"on {data.answer['gpu_budget']} GPUs at the highest rate verified there"
    else:
        where = "at its own highest rate"
    caption = (f"One point per candidate (its rank as the label): the fleet's cost {where} against the "
               f"p{data.percentile:g} latency of that simulated fleet. Red diamonds: the Pareto frontier, "
               "the candidates no other beats on both cost and latency; pick the latency in the menu. "
               "Beside it, what stops each candidate.")
    return Chart("cost", title, caption, fig, 460, aside=_why_table(data))


def build_capacity_charts(data: CapacityData) -> list[Chart]:
    return [search_chart(data), cost_latency_chart(data)]
