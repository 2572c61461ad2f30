"""Report charts of a fleet (replicas over time, cost and SLO attainment per hour) and of sessions
(TTFT and prefix-cache hits by turn). Each returns no chart when the run has no such data, so
other runs' reports are unchanged."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servesim.report.figures import MAX_POINTS, TEMPLATE, Chart, f32
from servesim.report.run_data import RunData
from servesim.report.series import bin_edges, event_rate


def fleet_charts(data: RunData) -> list[Chart]:
    fleet = data.summary.get("fleet")
    charts = []
    if data.replicas is not None and len(data.replicas):
        charts.append(replicas_chart(data, data.replicas))
    if fleet and fleet.get("hourly"):
        charts.append(hourly_chart(fleet))
    sessions = data.summary.get("sessions")
    if sessions and sessions.get("ttft_by_turn"):
        charts.append(turns_chart(sessions))
    return charts


def replicas_chart(data: RunData, timeline: pd.DataFrame) -> Chart:
    """Each group's billed replicas (ready + cold-starting + draining) and ready replicas as step
    functions, with the arrival rate behind them."""
    end = float(data.summary.get("fleet", {}).get("horizon_s") or timeline["time_s"].max())
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    arrivals = data.requests["arrival_s"].to_numpy(dtype=float)
    if arrivals.size:
        edges = bin_edges(0.0, max(end, 1e-6), max_bins=int(np.clip(arrivals.size // 20, 20, MAX_POINTS)))
        rate = event_rate(arrivals, edges)
        width = float(edges[1] - edges[0])
        fig.add_trace(go.Scatter(x0=float(edges[0] + width / 2), dx=width, y=f32(rate), name="arrivals/s",
                                 mode="lines", line={"width": 1, "color": "#bbbbbb"},
                                 hovertemplate="t %{x:.4g} s: %{y:.3g} req/s<extra>arrivals</extra>"),
                      secondary_y=True)
    for name, rows in timeline.groupby("group", sort=False):
        times = np.append(rows["time_s"].to_numpy(dtype=float), end)
        billed = rows["ready"] + rows["provisioning"] + rows["draining"]
        for values, label, dash in ((billed.to_numpy(), f"{name}: billed", None),
                                    (rows["ready"].to_numpy(), f"{name}: ready", "dot")):
            fig.add_trace(go.Scatter(x=f32(times), y=np.append(values, values[-1]).astype(np.float32),
                                     name=label, mode="lines", line={"shape": "hv", "dash": dash},
                                     hovertemplate="t %{x:.4g} s: %{y} replicas<extra>" + label + "</extra>"),
                          secondary_y=False)
    fig.update_xaxes(title_text="simulated time (s)")
    fig.update_yaxes(title_text="replicas", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="arrivals/s", secondary_y=True, rangemode="tozero", showgrid=False)
    fig.update_layout(template=TEMPLATE, height=420, hovermode="x unified")
    return Chart("replicas", "Replicas over time",
                 "Billed replicas (ready, cold-starting and draining: what GPU-hours integrate) and ready "
                 "ones (dotted: what serves) per group; grey: the arrival rate. The gap between a rise in "
                 "load and a rise in ready replicas is the autoscaler's reaction plus the cold start.",
                 fig, 420)


def hourly_chart(fleet: dict[str, Any]) -> Chart:
    """Cost per hour (bars) and SLO attainment per hour (line)."""
    hourly = fleet["hourly"]
    hours = [row["hour"] for row in hourly]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    costs = [row["cost_usd"] for row in hourly]
    if all(c is not None for c in costs):
        fig.add_trace(go.Bar(x=hours, y=costs, name="cost (USD)", marker_color="#9ecae1",
                             hovertemplate="hour %{x}: $%{y:.2f}<extra></extra>"), secondary_y=False)
    replicas = [row["replicas_mean"] for row in hourly]
    fig.add_trace(go.Scatter(x=hours, y=replicas, name="mean replicas", mode="lines+markers",
                             line={"color": "#1f77b4"},
                             hovertemplate="hour %{x}: %{y:.2f} replicas<extra></extra>"), secondary_y=False)
    attainment = [row["slo_attainment"] for row in hourly]
    if any(a is not None for a in attainment):
        fig.add_trace(go.Scatter(x=hours, y=[None if a is None else 100 * a for a in attainment],
                                 name="SLO attainment (%)", mode="lines+markers", line={"color": "#d62728"},
                                 hovertemplate="hour %{x}: %{y:.2f}%<extra></extra>"), secondary_y=True)
        fig.update_yaxes(title_text="SLO attainment (%)", secondary_y=True, range=[0, 101], showgrid=False)
    fig.update_xaxes(title_text="hour of the run (by arrival)", dtick=1)
    fig.update_yaxes(title_text="USD / replicas", secondary_y=False, rangemode="tozero")
    fig.update_layout(template=TEMPLATE, height=400, hovermode="x unified")
    total = fleet.get("cost_usd")
    cost = f"${total:,.2f}" if total is not None else "no price"
    return Chart("hourly", "Cost and SLO attainment per hour",
                 f"{fleet['gpu_hours']:,.1f} GPU-hours, {cost} over the run. Each hour's cost is its "
                 "GPU-hours at each group's price; attainment is over the requests that arrived in it.",
                 fig, 400)


def turns_chart(sessions: dict[str, Any]) -> Chart:
    """TTFT percentiles and the prefix-cache hit rate by turn of the session."""
    rows = sessions["ttft_by_turn"]
    turns = [str(row["turn"]) for row in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for key, label in (("ttft_p50", "TTFT p50"), ("ttft_p99", "TTFT p99")):
        values = [None if row[key] is None else 1e3 * row[key] for row in rows]
        fig.add_trace(go.Scatter(x=turns, y=values, name=label, mode="lines+markers",
                                 hovertemplate="turn %{x}: %{y:.1f} ms<extra>" + label + "</extra>"),
                      secondary_y=False)
    fig.add_trace(go.Bar(x=turns, y=[100 * row["hit_rate"] for row in rows], name="prefix-cache hit rate (%)",
                         opacity=0.35, hovertemplate="turn %{x}: %{y:.1f}%<extra></extra>"), secondary_y=True)
    fig.update_xaxes(title_text="turn of the session", type="category")
    fig.update_yaxes(title_text="TTFT (ms)", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="hit rate (%)", secondary_y=True, range=[0, 100], showgrid=False)
    fig.update_layout(template=TEMPLATE, height=380, hovermode="x unified")
    return Chart("turns", "Sessions: TTFT and cache hits by turn",
                 f"{sessions['sessions']:,} sessions, {sessions['requests']:,} requests. Later turns send "
                 "longer prompts but find the earlier turns' prompt and answers in the prefix cache.",
                 fig, 380)
