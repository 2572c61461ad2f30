"""The run report's charts, as plotly figures built from a loaded run.

Every chart is reduced before it is drawn: CDFs keep at most ``MAX_POINTS`` points (dense in the
tail), time series are binned into at most ``MAX_POINTS`` equal bins and drawn with ``x0``/``dx``
instead of an x array, and arrays are float32. So a run of any length embeds a few hundred KB of
data, and the page stays light next to the ~4.8 MB plotly.js bundle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servesim.report.format import METRICS, Metric, fmt_latency
from servesim.report.run_data import RunData
from servesim.report.series import (
    bin_centers,
    bin_edges,
    bin_max,
    event_rate,
    hold_durations,
    interval_covered_mean,
    interval_mean,
    interval_rate,
    thin_cdf,
    weighted_cdf,
)
from servesim.report.verdict import SloCheck

MAX_POINTS = 2000  # per trace
MAX_SCATTER_POINTS = 3000  # step-time scatter, over all traces
MIN_EVENTS_PER_RATE_BIN = 20  # a requests/s bin with fewer events is mostly noise

TEMPLATE = go.layout.Template(
    layout={
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "colorway": ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                     "#7f7f7f", "#bcbd22", "#17becf"],
        "xaxis": {"gridcolor": "#e8e8e8", "linecolor": "#999", "zeroline": False},
        "yaxis": {"gridcolor": "#e8e8e8", "linecolor": "#999", "zeroline": False},
        "margin": {"l": 60, "r": 30, "t": 40, "b": 50},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
    }
)
BOUND_COLORS = {"compute": "#d62728", "memory": "#1f77b4", "communication": "#2ca02c", "overhead": "#7f7f7f"}


@dataclass(frozen=True)
class Chart:
    """One figure of the report with its heading and a sentence on how to read it."""

    key: str
    title: str
    caption: str
    figure: go.Figure | None  # None: the run lacks the data; the caption says so instead
    height: int
    aside: str = ""
    """HTML shown beside the chart (a table that explains it); empty for none."""


def f32(values: np.ndarray) -> np.ndarray:
    """float32 halves the embedded bytes; seven digits are plenty on screen."""
    return np.asarray(values, dtype=np.float32)


def _time_range(data: RunData) -> tuple[float, float]:
    """From time 0 (or the first arrival) to the last step end, finish or arrival."""
    ends = [float(data.summary.get("duration_s") or 0.0)]
    steps, req = data.steps, data.requests
    if len(steps):
        ends.append(float((steps["start_s"] + steps["duration_s"]).max()))
    for column in ("arrival_s", "finish_s", "first_token_s"):
        if len(req) and req[column].notna().any():
            ends.append(float(req[column].max()))
    start = min(0.0, float(req["arrival_s"].min())) if len(req) else 0.0
    return start, max(max(ends), start + 1e-6)


def _binned_trace(edges: np.ndarray, y: np.ndarray, name: str, hover: str, **kwargs: object) -> go.Scatter:
    """A line over equal time bins, drawn at the bin centers with x0/dx (no x array)."""
    centers = bin_centers(edges)
    width = float(edges[1] - edges[0]) if edges.size > 1 else 1.0
    return go.Scatter(
        x0=float(centers[0]), dx=width, y=f32(y), name=name, mode="lines",
        hovertemplate=f"{hover}<extra>{name}</extra>", **kwargs,
    )


# ---------------------------------------------------------------- latency CDFs


def _cdf_trace(values: np.ndarray, counts: np.ndarray | None, metric: Metric, population: str) -> go.Scatter:
    x, cdf = thin_cdf(*weighted_cdf(values, counts), max_points=MAX_POINTS)
    return go.Scatter(
        x=f32(x * metric.scale), y=f32(cdf), mode="lines", name=metric.label, showlegend=False,
        line={"shape": "hv"},
        hovertemplate=f"{metric.label} %{{x:.4g}} {metric.unit}<br>%{{y:.2%}} of {population} ≤ this"
                      "<extra></extra>",
    )


def latency_cdf_chart(data: RunData, checks: list[SloCheck]) -> Chart:
    """CDFs of TTFT, TPOT, ITL and E2E, with each SLO limit and the p99 level marked."""
    done = data.completed()  # the same population as the summary's percentiles
    panels = [
        (METRICS["ttft_s"], done["ttft_s"].to_numpy(dtype=float), None, "requests"),
        (METRICS["tpot_s"], done["tpot_s"].to_numpy(dtype=float), None, "requests"),
        (METRICS["itl_s"], data.itl_values, data.itl_counts, "tokens"),
        (METRICS["e2e_s"], done["e2e_s"].to_numpy(dtype=float), None, "requests"),
    ]
    fig = make_subplots(rows=2, cols=2, vertical_spacing=0.16, horizontal_spacing=0.08)
    limits = {c.metric.key: c.limit_s for c in checks}
    for i, (metric, values, counts, population) in enumerate(panels):
        row, col = divmod(i, 2)
        fig.add_trace(_cdf_trace(values, counts, metric, population), row=row + 1, col=col + 1)
        fig.add_hline(y=0.99, line={"dash": "dot", "color": "#999", "width": 1}, row=row + 1, col=col + 1)
        if metric.key in limits:
            fig.add_vline(x=limits[metric.key] * metric.scale, line={"dash": "dash", "color": "#d62728"},
                          annotation_text=f"SLO {fmt_latency(limits[metric.key], metric.unit)}",
                          annotation_font_color="#d62728", annotation_position="bottom right",
                          row=row + 1, col=col + 1)
        fig.update_xaxes(title_text=f"{metric.label} ({metric.unit})", row=row + 1, col=col + 1)
        fig.update_yaxes(title_text=f"fraction of {population} ≤ x", range=[0, 1.02], tickformat=".0%",
                         row=row + 1, col=col + 1)
    fig.update_layout(template=TEMPLATE, height=640, updatemenus=[_axis_type_buttons(4)])
    return Chart("latency", "Latency distributions",
                 "Cumulative distributions: read a percentile where a curve crosses its level (dotted "
                 "line: p99). TTFT, TPOT and E2E are per completed request; ITL is per generated token. "
                 "Dashed red: SLO limit.", fig, 640)


def _axis_type_buttons(n_axes: int, initial: str = "linear") -> dict:
    """Buttons that switch every x axis between linear and log (long latency tails, token counts
    spanning decodes and prefills)."""
    names = ["xaxis"] + [f"xaxis{i}" for i in range(2, n_axes + 1)]
    return {
        "type": "buttons", "direction": "right", "x": 0.0, "xanchor": "left", "y": 1.04,
        "yanchor": "bottom", "active": 1 if initial == "log" else 0,
        "buttons": [
            {"label": f"{kind} x", "method": "relayout", "args": [{f"{a}.type": kind for a in names}]}
            for kind in ("linear", "log")
        ],
    }


# ---------------------------------------------------------------- throughput


def throughput_chart(data: RunData, t_range: tuple[float, float]) -> Chart:
    """Output and prefill tokens/s (left axis); arrivals and completions per second (right axis).

    Output tokens are the first tokens (at each request's first-token time) plus the decode tokens
    of every step, spread over the step's duration, so the curve integrates to the tokens produced.
    """
    req, steps = data.requests, data.steps
    completed = req.loc[req["status"] == "completed", "finish_s"].to_numpy(dtype=float)
    n_bins = int(np.clip(len(req) // MIN_EVENTS_PER_RATE_BIN, 20, MAX_POINTS))
    edges = bin_edges(*t_range, max_bins=n_bins)
    start, duration = steps["start_s"].to_numpy(float), steps["duration_s"].to_numpy(float)
    output = (event_rate(req["first_token_s"].to_numpy(float), edges)
              + interval_rate(start, duration, steps["decode_tokens"].to_numpy(float), edges))
    prefill = interval_rate(start, duration, steps["prefill_tokens"].to_numpy(float), edges)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    hover = "t %{x:.4g} s: %{y:,.0f}"
    fig.add_trace(_binned_trace(edges, output, "output tokens/s", hover), secondary_y=False)
    fig.add_trace(_binned_trace(edges, prefill, "prefill tokens/s", hover, line={"dash": "dot"}),
                  secondary_y=False)
    rate_hover = "t %{x:.4g} s: %{y:.3g}"
    fig.add_trace(_binned_trace(edges, event_rate(req["arrival_s"].to_numpy(float), edges), "arrivals/s",
                                rate_hover, line={"width": 1}), secondary_y=True)
    fig.add_trace(_binned_trace(edges, event_rate(completed, edges), "completed requests/s", rate_hover),
                  secondary_y=True)
    fig.update_xaxes(title_text="simulated time (s)")
    fig.update_yaxes(title_text="tokens/s (all replicas)", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="requests/s", secondary_y=True, rangemode="tozero", showgrid=False)
    fig.update_layout(template=TEMPLATE, height=440, hovermode="x unified")
    width = edges[1] - edges[0]
    return Chart("throughput", "Throughput over time",
                 f"Rates in {width:.3g} s bins, summed over replicas. A completion rate that stays below the "
                 "arrival rate means the queue is growing.", fig, 440)


# ---------------------------------------------------------------- batch and KV cache


def _replica_groups(data: RunData) -> dict[int, np.ndarray]:
    # cast: pandas-stubs types ``indices`` as Hashable -> ndarray | list | Index; grouping by the
    # integer replica column gives integer keys and arrays of positions.
    indices = cast("dict[int, np.ndarray]", data.steps.groupby("replica", sort=True).indices)
    return {int(r): idx for r, idx in indices.items()}


def batch_kv_chart(data: RunData, t_range: tuple[float, float]) -> Chart:
    """Batch size and KV-cache use (% of blocks) per replica, time-averaged per bin."""
    steps = data.steps
    groups = _replica_groups(data)
    edges = bin_edges(*t_range, max_bins=max(200, min(MAX_POINTS, 16_000 // max(len(groups), 1))))
    start, duration = steps["start_s"].to_numpy(float), steps["duration_s"].to_numpy(float)
    held = hold_durations(start, duration, steps["replica"].to_numpy())
    total = steps["kv_blocks_total"].to_numpy(float)
    used = steps["kv_blocks_used"].to_numpy(float)
    kv_pct = np.where(total > 0, 100.0 * used / np.maximum(total, 1), np.nan)
    batch = steps["batch_size"].to_numpy(float)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    many = len(groups) > 1
    for i, (replica, idx) in enumerate(groups.items()):
        color = TEMPLATE.layout.colorway[i % len(TEMPLATE.layout.colorway)]
        pool = str(steps["pool"].iat[idx[0]]) if "pool" in steps else ""
        label = (f"replica {replica}" + (f" ({pool})" if pool else "")) if many else "mean"
        fig.add_trace(_binned_trace(edges, interval_mean(start[idx], duration[idx], batch[idx], edges),
                                    f"batch, {label}", "t %{x:.4g} s: %{y:.1f} requests",
                                    line={"color": color}, legendgroup=str(replica)), row=1, col=1)
        fig.add_trace(_binned_trace(edges, interval_covered_mean(start[idx], held[idx], kv_pct[idx], edges),
                                    f"KV, {label}", "t %{x:.4g} s: %{y:.1f}%", line={"color": color},
                                    legendgroup=str(replica), showlegend=not many), row=2, col=1)
    fig.add_trace(_binned_trace(edges, bin_max(start, kv_pct, edges),
                                "KV peak" + (" (any replica)" if many else ""), "t %{x:.4g} s: %{y:.1f}%",
                                line={"color": "#999", "width": 1, "dash": "dot"}, connectgaps=False),
                  row=2, col=1)
    fig.update_yaxes(title_text="batch size (requests)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="KV cache used (% of blocks)", range=[0, 105], row=2, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=2, col=1)
    fig.update_layout(template=TEMPLATE, height=560, hovermode="x unified")
    return Chart("batch_kv", "Batch size and KV-cache use",
                 "Time averages per bin: batch size counts idle time as 0; KV use holds each step's "
                 "level until the replica's next step. Dotted: the highest KV use of any step in the bin.",
                 fig, 560)


# ---------------------------------------------------------------- queue


def queue_chart(data: RunData, t_range: tuple[float, float]) -> Chart:
    """Waiting and running requests (summed over replicas), and preemptions per second."""
    steps = data.steps
    edges = bin_edges(*t_range, max_bins=MAX_POINTS)
    start, duration = steps["start_s"].to_numpy(float), steps["duration_s"].to_numpy(float)
    held = hold_durations(start, duration, steps["replica"].to_numpy())
    waiting = steps["waiting"].to_numpy(float)
    many = data.num_replicas > 1
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    hover = "t %{x:.4g} s: %{y:.1f}"
    fig.add_trace(_binned_trace(edges, interval_mean(start, held, waiting, edges), "waiting (mean)", hover))
    fig.add_trace(_binned_trace(edges, interval_mean(start, held, steps["running"].to_numpy(float), edges),
                                "running (mean)", hover))
    peak_name = "waiting, peak" + (" on one replica" if many else "")
    fig.add_trace(_binned_trace(edges, bin_max(start, waiting, edges), peak_name, "t %{x:.4g} s: %{y:.0f}",
                                line={"width": 1, "dash": "dot"}))
    preempted = steps["preempted"].to_numpy(float)
    if preempted.sum() > 0:
        fig.add_trace(_binned_trace(edges, event_rate(start, edges, preempted), "preemptions/s",
                                    "t %{x:.4g} s: %{y:.3g}/s", line={"width": 1}), secondary_y=True)
        fig.update_yaxes(title_text="preemptions/s", secondary_y=True, rangemode="tozero", showgrid=False)
    fig.update_xaxes(title_text="simulated time (s)")
    fig.update_yaxes(title_text="requests" + (" (all replicas)" if many else ""), rangemode="tozero",
                     secondary_y=False)
    fig.update_layout(template=TEMPLATE, height=420, hovermode="x unified")
    return Chart("queue", "Queue and running requests",
                 "Waiting is the queue length at each step start, held until the next step. A queue that "
                 "keeps climbing means the offered load exceeds what the deployment serves.", fig, 420)


# ---------------------------------------------------------------- step time


def sample_steps(durations: np.ndarray, k: int) -> np.ndarray:
    """Indices of at most k steps: evenly spread over the run, plus the slowest ones."""
    n = durations.size
    if n <= k:
        return np.arange(n)
    n_slow = k // 10
    slowest = np.argpartition(durations, n - n_slow)[n - n_slow:]
    spread = np.linspace(0, n - 1, k - n_slow).astype(np.int64)
    return np.unique(np.concatenate([spread, slowest]))


def step_time_chart(data: RunData) -> Chart:
    """Each step's duration against the tokens it processed, coloured by its bound."""
    steps = data.steps
    tokens = (steps["prefill_tokens"] + steps["decode_tokens"]).to_numpy(float)
    duration_ms = steps["duration_s"].to_numpy(float) * 1e3
    keep = sample_steps(duration_ms, MAX_SCATTER_POINTS)
    bound = steps["bound"].astype(str).to_numpy()[keep]
    custom = np.column_stack([
        steps["num_prefills"].to_numpy(float)[keep], steps["num_decodes"].to_numpy(float)[keep],
        steps["replica"].to_numpy(float)[keep], steps["start_s"].to_numpy(float)[keep],
    ])
    fig = go.Figure()
    for name in sorted(set(bound.tolist())):
        sel = bound == name
        fig.add_trace(go.Scattergl(
            x=f32(tokens[keep][sel]), y=f32(duration_ms[keep][sel]), customdata=f32(custom[sel]),
            mode="markers", name=f"{name}-bound", marker={"size": 5, "opacity": 0.6,
                                                          "color": BOUND_COLORS.get(name, "#bcbd22")},
            hovertemplate="%{x:,.0f} tokens, %{y:.3g} ms<br>%{customdata[0]:.0f} prefills, "
                          "%{customdata[1]:.0f} decodes<br>replica %{customdata[2]:.0f} "
                          f"at t %{{customdata[3]:.4g}} s<extra>{name}</extra>",
        ))
    shown = ("all" if keep.size == len(steps)
             else f"{keep.size:,} of {len(steps):,} (evenly spread, plus the slowest)")
    # Log x by default: decode-only steps (tens of tokens) and prefills (thousands) both stay visible.
    fig.update_xaxes(title_text="tokens processed in the step (prefill + decode)", type="log")
    fig.update_yaxes(title_text="step time (ms)", rangemode="tozero")
    fig.update_layout(template=TEMPLATE, height=440, updatemenus=[_axis_type_buttons(1, initial="log")],
                      legend={"x": 1.0, "xanchor": "right"}, margin={"t": 60})
    return Chart("step_time", "Step time against batch composition",
                 f"One point per engine step ({shown} steps), coloured by what bounds it in the cost model.",
                 fig, 440)


def build_charts(data: RunData, checks: list[SloCheck]) -> list[Chart]:
    """All charts of the run report, in page order."""
    t_range = _time_range(data)
    return [
        latency_cdf_chart(data, checks),
        throughput_chart(data, t_range),
        batch_kv_chart(data, t_range),
        queue_chart(data, t_range),
        step_time_chart(data),
    ]
