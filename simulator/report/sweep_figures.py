"""The sweep report's charts: the knee of throughput against load, latency against load with the
SLO lines, heatmaps over two varied keys, and the cost/latency Pareto frontier.

Every marker's hover lists the point's full configuration (all varied keys) with its numbers, so a
reader can go from any dot to the run folder it summarises. Error bars are the ``.ci95`` columns:
95% confidence half-widths of the mean over replications.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servesim.report.figures import TEMPLATE, Chart
from servesim.report.format import METRICS
from servesim.report.sweep_data import SweepData, format_value

COLORS = TEMPLATE.layout.colorway


@dataclass(frozen=True)
class SweepMetric:
    """A column of results.parquet as the charts show it."""

    column: str
    label: str
    unit: str
    scale: float = 1.0
    higher_is_better: bool = True


THROUGHPUT = SweepMetric("throughput.requests_per_s", "throughput", "req/s")
GOODPUT = SweepMetric("goodput_requests_per_s", "goodput", "req/s")
OUTPUT_TOKENS = SweepMetric("throughput.output_tokens_per_s", "output tokens/s", "tok/s")
ATTAINMENT = SweepMetric("slo_attainment", "SLO attainment", "%", 100.0)
LATENCIES = {
    key: SweepMetric(f"{key}.p99", f"p99 {m.label}", m.unit, m.scale, higher_is_better=False)
    for key, m in METRICS.items()
    if key != "queueing_s"
}


def _values(data: SweepData, frame: pd.DataFrame, column: str) -> np.ndarray:
    if column not in frame:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)


def _has(data: SweepData, metric: SweepMetric) -> bool:
    return bool(np.isfinite(_values(data, data.ok, metric.column)).any())


def _groups(data: SweepData, frame: pd.DataFrame, exclude: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """Rows grouped by the varied keys other than ``exclude``: one line per combination."""
    others = [a for a in data.axes if a not in exclude]
    if "policy" in others and "policy.name" in others:  # the name restates the mapping
        others.remove("policy.name")
    if not others:
        return [("all points", frame)]
    out = []
    for values, group in frame.groupby(others, sort=False, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        label = ", ".join(
            f"{k.rsplit('.', 1)[-1] if k != 'policy.name' else 'policy'}={format_value(v)}"
            for k, v in zip(others, values, strict=True)
        )
        out.append((label, group))
    return out


def _hover(metric: SweepMetric, extra: str = "") -> str:
    return (
        f"<b>{metric.label} %{{y:.4~g}} {metric.unit}</b> ± %{{customdata[0]:.3~g}}{extra}"
        "<br>%{text}<extra></extra>"
    )


def _line(
    data: SweepData,
    group: pd.DataFrame,
    x_column: str,
    metric: SweepMetric,
    name: str,
    color: str,
    show_legend: bool,
) -> go.Scatter:
    y = _values(data, group, metric.column) * metric.scale
    ci = np.nan_to_num(_values(data, group, f"{metric.column}.ci95") * metric.scale)
    return go.Scatter(
        x=_values(data, group, x_column),
        y=y,
        error_y={"type": "data", "array": ci, "visible": True, "thickness": 1, "width": 3},
        mode="lines+markers",
        name=name,
        legendgroup=name,
        showlegend=show_legend,
        line={"color": color},
        marker={"size": 7},
        customdata=np.column_stack([ci]),
        text=group["config_text"].to_numpy(),
        hovertemplate=_hover(metric),
    )


def _missing(key: str, title: str, why: str) -> Chart:
    return Chart(key, title, why, None, 0)


BOTTOM_LEGEND = {"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0}
"""Legends go under the plot: above it they grow into the menus when there are many lines."""


def _legend_room(data: SweepData, exclude: list[str | None]) -> int:
    """Extra pixels under a chart for a legend of one entry per line (about four per row)."""
    lines = len(_groups(data, data.ok, [e for e in exclude if e is not None]))
    return 24 * max(0, math.ceil(lines / 4) - 1)


# ---------------------------------------------------------------- load curves


def knee_chart(data: SweepData) -> Chart:
    """Throughput and goodput against the offered rate: where they bend away from y = x."""
    title = "Throughput and goodput against load"
    rate = data.rate_axis
    if rate is None:
        return _missing(
            "knee", title, "No arrival-rate axis varied in this sweep, so there is no load curve."
        )
    second = GOODPUT if _has(data, GOODPUT) else OUTPUT_TOKENS
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1)
    ok = data.ok
    rates = _values(data, ok, rate)
    for i, (label, group) in enumerate(_groups(data, ok, [rate])):
        color = COLORS[i % len(COLORS)]
        fig.add_trace(_line(data, group, rate, THROUGHPUT, label, color, True), row=1, col=1)
        fig.add_trace(_line(data, group, rate, second, label, color, False), row=1, col=2)
    if np.isfinite(rates).any():
        hi = float(np.nanmax(rates))
        fig.add_trace(
            go.Scatter(
                x=[0, hi],
                y=[0, hi],
                mode="lines",
                name="offered (y = x)",
                line={"color": "#999", "dash": "dash", "width": 1},
                hovertemplate="offered %{x:.3~g} req/s<extra></extra>",
            ),
            row=1,
            col=1,
        )
    fig.update_xaxes(title_text=f"offered rate ({rate}, req/s)")
    fig.update_yaxes(title_text=f"{THROUGHPUT.label} ({THROUGHPUT.unit})", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=f"{second.label} ({second.unit})", rangemode="tozero", row=1, col=2)
    fig.update_layout(template=TEMPLATE, height=460 + _legend_room(data, [rate]), hovermode="closest",
                      margin={"t": 40, "b": 60 + _legend_room(data, [rate])}, legend=BOTTOM_LEGEND)
    caption = (
        "Mean over replications with 95% confidence bars, one line per combination of the other "
        "varied keys. Throughput follows the dashed offered-load line until the deployment saturates "
        "(the knee); past it the queue grows and "
        + (
            "goodput (requests within every SLO per second) falls."
            if second is GOODPUT
            else "latency climbs (no SLOs set, so output tokens/s stands in for goodput)."
        )
    )
    return Chart("knee", title, caption, fig, 460 + _legend_room(data, [rate]))


def latency_chart(data: SweepData) -> Chart:
    """p99 TTFT and TPOT against the offered rate, with the SLO limits as horizontal lines."""
    title = "Tail latency against load"
    rate = data.rate_axis
    if rate is None:
        return _missing("latency", title, "No arrival-rate axis varied in this sweep.")
    panels = [LATENCIES["ttft_s"], LATENCIES["tpot_s"]]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1)
    for i, (label, group) in enumerate(_groups(data, data.ok, [rate])):
        for col, metric in enumerate(panels, start=1):
            fig.add_trace(
                _line(data, group, rate, metric, label, COLORS[i % len(COLORS)], col == 1), row=1, col=col
            )
    for col, (key, metric) in enumerate((("ttft_s", panels[0]), ("tpot_s", panels[1])), start=1):
        if key in data.slos:
            fig.add_hline(
                y=data.slos[key] * metric.scale,
                line={"dash": "dash", "color": "#d62728"},
                annotation_text=f"SLO {data.slos[key] * metric.scale:g} {metric.unit}",
                annotation_font_color="#d62728",
                annotation_position="top left",
                row=1,
                col=col,
            )
        fig.update_yaxes(title_text=f"{metric.label} ({metric.unit})", rangemode="tozero", row=1, col=col)
    fig.update_xaxes(title_text=f"offered rate ({rate}, req/s)")
    room = _legend_room(data, [rate])
    fig.update_layout(template=TEMPLATE, height=480 + room, margin={"t": 60, "b": 60 + room},
                      updatemenus=[_y_type_buttons()], legend=BOTTOM_LEGEND)
    return Chart(
        "latency",
        title,
        "p99 of each point (mean over replications, 95% confidence bars). Dashed red: the SLO limit; a "
        "point meets it when its p99 is at or below the line. Use log y to read past the knee.",
        fig,
        480 + room,
    )


def _y_type_buttons() -> dict:
    return {
        "type": "buttons",
        "direction": "right",
        "x": 0.0,
        "xanchor": "left",
        "y": 1.02,
        "yanchor": "bottom",
        "buttons": [
            {"label": f"{kind} y", "method": "relayout", "args": [{"yaxis.type": kind, "yaxis2.type": kind}]}
            for kind in ("linear", "log")
        ],
    }


# ---------------------------------------------------------------- heatmaps


def _heatmap_metrics(data: SweepData, pair: tuple[str, str]) -> list[SweepMetric]:
    metrics = []
    if data.rate_axis and data.slos and data.rate_axis not in pair:
        metrics.append(SweepMetric("_max_rate_meeting", "highest rate meeting the SLOs", "req/s"))
    for m in (GOODPUT, THROUGHPUT, OUTPUT_TOKENS, LATENCIES["ttft_s"], LATENCIES["tpot_s"], ATTAINMENT):
        if _has(data, m):
            metrics.append(m)
    return metrics


MIN_HEATMAP_FILL = 0.75
"""A heatmap is drawn only over two dimensions whose combinations mostly ran (a grid), never over
keys varied together (a zip), whose cells would be mostly empty."""


def axis_groups(data: SweepData) -> list[list[str]]:
    """The non-rate axes, grouped where one determines another: keys zipped together, or a
    ``policy`` mapping and the ``policy.name`` it implies. Each group is one dimension."""
    axes = [a for a in data.axes if a != data.rate_axis]
    labels = {a: data.frame[a].map(format_value) for a in axes}
    parent = {a: a for a in axes}

    def root(a: str) -> str:
        while parent[a] != a:
            a = parent[a]
        return a

    for a, b in combinations(axes, 2):
        pairs = len(set(zip(labels[a], labels[b], strict=True)))
        if pairs == max(labels[a].nunique(), labels[b].nunique()):
            parent[root(b)] = root(a)
    groups: dict[str, list[str]] = {}
    for a in axes:
        groups.setdefault(root(a), []).append(a)
    return list(groups.values())


def _group_label(row: pd.Series, group: list[str]) -> str:
    shown = [a for a in group if not (a == "policy.name" and "policy" in group)]
    if len(shown) == 1:
        return format_value(row[shown[0]])
    return ", ".join(f"{a.rsplit('.', 1)[-1]}={format_value(row[a])}" for a in shown)


def with_dimensions(data: SweepData) -> tuple[SweepData, list[str]]:
    """``data`` with one column per axis group (a group of one is its own axis) and their names."""
    frame = data.frame.copy()
    dims = []
    for group in axis_groups(data):
        if len(group) == 1:
            dims.append(group[0])
            continue
        name = " + ".join(a for a in group if not (a == "policy.name" and "policy" in group))
        frame[name] = [_group_label(row, group) for _, row in frame.iterrows()]
        dims.append(name)
    return replace(data, frame=frame), dims


def _fill(data: SweepData, x: str, y: str) -> float:
    labels_x, labels_y = data.frame[x].map(format_value), data.frame[y].map(format_value)
    cells = labels_x.nunique() * labels_y.nunique()
    return len(set(zip(labels_x, labels_y, strict=True))) / cells if cells else 0.0


def heatmap_pairs(data: SweepData, dims: list[str] | None = None) -> list[tuple[str, str]]:
    """Up to two pairs of dimensions: the two non-rate ones with most levels, and one against the
    rate; pairs whose combinations mostly did not run are left out (see MIN_HEATMAP_FILL)."""
    if dims is None:
        dims = [a for a in data.axes if a != data.rate_axis]
    others = sorted(dims, key=lambda a: -data.frame[a].map(format_value).nunique())
    candidates: list[tuple[str, str]] = []
    if len(others) >= 2:
        candidates.append((others[1], others[0]))
    if data.rate_axis and others:
        candidates.append((data.rate_axis, others[0]))
    return [(x, y) for x, y in candidates if _fill(data, x, y) >= MIN_HEATMAP_FILL]


def _cell_best(
    data: SweepData, x: str, y: str, metric: SweepMetric
) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """For each (x, y) cell, the best point over the other keys: value and its hover text."""
    frame = data.ok.copy()
    if metric.column == "_max_rate_meeting":
        assert data.rate_axis is not None  # _heatmap_metrics offers this metric only with a rate axis
        frame["_max_rate_meeting"] = np.where(frame["meets"], _values(data, frame, data.rate_axis), np.nan)
    xs = [format_value(v) for v in pd.unique(data.frame[x].dropna())]
    ys = [format_value(v) for v in pd.unique(data.frame[y].dropna())]
    z = np.full((len(ys), len(xs)), np.nan)
    text = np.full((len(ys), len(xs)), "no point that ran", dtype=object)
    frame["_x"] = frame[x].map(format_value)
    frame["_y"] = frame[y].map(format_value)
    values = _values(data, frame, metric.column) * metric.scale
    frame["_v"] = values
    for (xv, yv), cell in frame.groupby(["_x", "_y"], sort=False):
        finite = cell[np.isfinite(cell["_v"])]
        i, j = ys.index(str(yv)), xs.index(str(xv))  # the keys are format_value's strings
        if not len(finite):
            text[i, j] = "no point meets the SLOs" if metric.column == "_max_rate_meeting" else "no value"
            continue
        best = finite.loc[finite["_v"].idxmax() if metric.higher_is_better else finite["_v"].idxmin()]
        z[i, j] = best["_v"]
        text[i, j] = (
            f"<b>{metric.label} {best['_v']:.4g} {metric.unit}</b> "
            f"(best of {len(cell)} point{'s' if len(cell) > 1 else ''})<br>{best['config_text']}"
        )
    return xs, ys, z, text


def heatmap_chart(data: SweepData, x: str, y: str, index: int) -> Chart:
    """One metric over two varied keys, with a menu to switch the metric."""
    metrics = _heatmap_metrics(data, (x, y))
    key = f"heatmap{index}"
    title = f"{y} × {x}"
    if not metrics:
        return _missing(key, title, "No metric with values to show.")
    fig = go.Figure()
    buttons = []
    for k, metric in enumerate(metrics):
        xs, ys, z, text = _cell_best(data, x, y, metric)
        # Light to mid blue, dark text readable on every cell; the better end is the darker one.
        scale = (
            [[0.0, "#f2f7fc"], [1.0, "#4f94cd"]]
            if metric.higher_is_better
            else [[0.0, "#4f94cd"], [1.0, "#f2f7fc"]]
        )
        fig.add_trace(
            go.Heatmap(
                x=xs,
                y=ys,
                z=z,
                text=text,
                texttemplate="%{z:.3~g}",
                hovertemplate="%{text}<extra></extra>",
                colorscale=scale,
                textfont={"color": "#222"},
                visible=k == 0,
                xgap=2,
                ygap=2,
                colorbar={"title": {"text": metric.unit}},
                name=metric.label,
            )
        )
        buttons.append(
            {
                "label": metric.label,
                "method": "update",
                "args": [{"visible": [i == k for i in range(len(metrics))]}],
            }
        )
    fig.update_xaxes(title_text=x, type="category", automargin=True)
    fig.update_yaxes(title_text=y, type="category", automargin=True)
    fig.update_layout(
        template=TEMPLATE,
        height=440,
        margin={"t": 70},
        updatemenus=[
            {
                "buttons": buttons,
                "direction": "down",
                "x": 0.0,
                "xanchor": "left",
                "y": 1.15,
                "yanchor": "top",
                "showactive": True,
            }
        ],
    )
    return Chart(
        key,
        f"Heatmap: {title}",
        "Each cell is the best point of that combination over the remaining varied keys (highest "
        "for throughput-like metrics, lowest for latencies); its hover names that point's full "
        "configuration. Pick the metric in the menu; empty cells: nothing ran or met the SLOs.",
        fig,
        440,
    )


# ---------------------------------------------------------------- Pareto


def pareto_front(cost: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both (lower cost and lower latency), by cost."""
    finite = np.flatnonzero(np.isfinite(cost) & np.isfinite(latency))
    order = finite[np.lexsort((latency[finite], cost[finite]))]
    front, best = [], np.inf
    for i in order:
        if latency[i] < best:
            front.append(i)
            best = latency[i]
    return np.asarray(front, dtype=np.int64)


def cost_axis(data: SweepData) -> tuple[str, str, str]:
    """(column, label, note) of the Pareto chart's x axis. $/hour (or GPUs without prices); when
    every point costs the same that is one vertical column, so the cost of the work instead:
    $ per million output tokens, or GPU-seconds per request without prices."""
    column = data.cost_column
    values = _values(data, data.ok, column)
    finite = values[np.isfinite(values)]
    if finite.size < 2 or np.ptp(finite) > 0:
        return column, ("cost ($/hour)" if column == "cost_per_hour" else "GPUs"), ""
    if column == "cost_per_hour":
        return ("_usd_per_1m_output_tokens", "$ per 1M output tokens",
                f" Every point costs the same ${finite[0]:.4g}/hour, so the x axis is the price of the "
                "work instead: $/hour over the output tokens served.")
    return ("_gpu_s_per_request", "GPU-seconds per request",
            f" Every point runs on {finite[0]:g} GPU(s), so the x axis is the cost of the work instead: "
            "GPUs / requests per second.")


def _with_cost_columns(data: SweepData, frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    tokens = _values(data, frame, OUTPUT_TOKENS.column) * 3600
    frame["_usd_per_1m_output_tokens"] = _values(data, frame, "cost_per_hour") / tokens * 1e6
    frame["_gpu_s_per_request"] = _values(data, frame, "gpus") / _values(data, frame, THROUGHPUT.column)
    return frame


def pareto_chart(data: SweepData) -> Chart:
    """Cost (or GPUs) against p99 latency; the frontier per offered rate highlighted."""
    cost_column, cost_label, cost_note = cost_axis(data)
    ok = _with_cost_columns(data, data.ok)
    metrics = [m for m in (LATENCIES["ttft_s"], LATENCIES["tpot_s"], LATENCIES["e2e_s"]) if _has(data, m)]
    if not len(ok) or not metrics:
        return _missing("pareto", "Cost against latency", "No point ran, so there is nothing to compare.")
    levels = (
        [(f"rate {format_value(v)}", g) for v, g in ok.groupby(data.rate_axis, sort=True)]
        if data.rate_axis
        else [("all points", ok)]
    )
    fig = go.Figure()
    visibility: list[int] = []
    for k, metric in enumerate(metrics):
        for i, (label, group) in enumerate(levels):
            color = COLORS[i % len(COLORS)]
            cost = _values(data, group, cost_column)
            latency = _values(data, group, metric.column) * metric.scale
            tput = _values(data, group, THROUGHPUT.column)
            custom = np.column_stack([tput, np.where(group["meets"], 1.0, 0.0)])
            hover = (
                f"{cost_label} %{{x:.4~g}}, {metric.label} %{{y:.4~g}} {metric.unit}<br>"
                "throughput %{customdata[0]:.3~g} req/s<br>%{text}<extra>" + label + "</extra>"
            )
            meets = group["meets"].to_numpy()
            fig.add_trace(
                go.Scatter(
                    x=cost,
                    y=latency,
                    mode="markers",
                    name=label,
                    legendgroup=label,
                    visible=k == 0,
                    text=group["config_text"].to_numpy(),
                    customdata=custom,
                    marker={
                        "color": color,
                        "size": 9,
                        "opacity": 0.45,
                        "symbol": np.where(meets, "circle", "circle-open").tolist(),
                    },
                    hovertemplate=hover,
                )
            )
            front = pareto_front(cost, latency)
            fig.add_trace(
                go.Scatter(
                    x=cost[front],
                    y=latency[front],
                    mode="lines+markers",
                    name=f"frontier, {label}",
                    legendgroup=label,
                    showlegend=False,
                    visible=k == 0,
                    text=group["config_text"].to_numpy()[front],
                    customdata=custom[front],
                    line={"color": color, "width": 2},
                    marker={"color": color, "size": 11, "line": {"color": "#222", "width": 1}},
                    opacity=0.9,
                    hovertemplate="<b>on the frontier</b><br>" + hover,
                )
            )
            visibility.extend([k, k])
    buttons = [
        {
            "label": m.label,
            "method": "update",
            "args": [
                {"visible": [v == k for v in visibility]},
                {"yaxis.title.text": f"{m.label} ({m.unit})"},
            ],
        }
        for k, m in enumerate(metrics)
    ]
    fig.update_xaxes(title_text=cost_label)
    fig.update_yaxes(title_text=f"{metrics[0].label} ({metrics[0].unit})", type="log", dtick=1)
    fig.update_layout(
        template=TEMPLATE,
        height=480,
        margin={"t": 80},
        updatemenus=[
            {
                "buttons": buttons,
                "direction": "down",
                "x": 1.0,
                "xanchor": "right",
                "y": 1.18,
                "yanchor": "top",
            }
        ],
    )
    per = " at each offered rate" if data.rate_axis else ""
    caption = (
        f"Each point that ran: {cost_label} against its p99 latency (log scale; pick the metric in the "
        f"menu). Lines: the Pareto frontier{per}, the points no other beats on both cost and latency. "
        "Filled markers meet every SLO, open ones miss one."
        + (
            ""
            if data.cost_column == "cost_per_hour"
            else " No price per GPU-hour is known for every point, so GPUs stand in for cost."
        )
        + cost_note
    )
    return Chart("pareto", "Cost against tail latency", caption, fig, 480)


def build_sweep_charts(data: SweepData) -> list[Chart]:
    charts = [knee_chart(data), latency_chart(data)]
    grouped, dims = with_dimensions(data)
    charts.extend(heatmap_chart(grouped, x, y, i)
                  for i, (x, y) in enumerate(heatmap_pairs(grouped, dims), start=1))
    charts.append(pareto_chart(data))
    return charts
