"""Two run-report charts that answer "is it the router, or the prompts?".

**Replicas** (router balance): per replica, the requests the router sent it, the share of the
run its engine was busy, and its p99 TTFT. A router that balances load gives equal bars; one
replica busier or slower than the others is the router's doing (round robin over requests of
unequal length), not the deployment's capacity.

**TTFT against prompt length**: each completed request's time to first token against its prompt
tokens (a sample of at most ``MAX_POINTS``), with the p50 and p99 over prompt-length bins. TTFT
that climbs with the prompt is prefill time; TTFT high at every length is queueing.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servesim.report.figures import TEMPLATE, Chart, f32
from servesim.report.format import METRICS, fmt_latency
from servesim.report.run_data import RunData
from servesim.report.verdict import SloCheck

MAX_POINTS = 3000
LENGTH_BINS = 12


def replica_balance(data: RunData) -> dict[str, np.ndarray]:
    """Per replica (sorted by index): requests routed to it, share of the run it was busy, its
    completed requests' p99 TTFT (NaN when none), and its group."""
    steps, requests = data.steps, data.requests
    replicas = np.union1d(steps["replica"].to_numpy(int), requests["replica"].dropna().to_numpy(int))
    replicas = replicas[replicas >= 0]
    start = min(float(requests["arrival_s"].min()) if len(requests) else 0.0, 0.0)
    ends = [float((steps["start_s"] + steps["duration_s"]).max()) if len(steps) else 0.0,
            float(requests["finish_s"].max()) if requests["finish_s"].notna().any() else 0.0]
    span = max(max(ends) - start, 1e-12)
    routed = requests["replica"].value_counts()
    busy = steps.groupby("replica")["duration_s"].sum()
    done = data.completed()
    p99 = done.groupby("replica")["ttft_s"].quantile(0.99) if len(done) else None
    pools = steps.groupby("replica")["pool"].first() if "pool" in steps else None
    return {
        "replica": replicas,
        "requests": np.array([int(routed.get(r, 0)) for r in replicas]),
        "busy": np.array([float(busy.get(r, 0.0)) / span for r in replicas]),
        "p99_ttft_s": np.array([float(p99.get(r, np.nan)) if p99 is not None else np.nan for r in replicas]),
        "pool": np.array([str(pools.get(r, "")) if pools is not None else "" for r in replicas],
                         dtype=object),
    }


def replica_chart(data: RunData) -> Chart:
    title = "Replicas: router balance"
    b = replica_balance(data)
    if b["replica"].size == 0:
        return Chart("balance", title, "No replica ran a step.", None, 0)
    labels = [f"{r}" + (f" ({p})" if p else "") for r, p in zip(b["replica"], b["pool"], strict=True)]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08,
                        subplot_titles=("requests routed", "busy (% of the run)", "p99 TTFT (s)"))
    for col, (values, hover) in enumerate(((b["requests"], "%{y:,} requests"),
                                           (100 * b["busy"], "busy %{y:.1f}% of the run"),
                                           (b["p99_ttft_s"], "p99 TTFT %{y:.4g} s")), start=1):
        fig.add_trace(go.Bar(x=labels, y=f32(values), marker={"color": "#1f77b4"}, showlegend=False,
                             hovertemplate=f"replica %{{x}}: {hover}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="replica", type="category", row=1, col=col)
    fig.update_layout(template=TEMPLATE, height=360, margin={"t": 60})
    counts = b["requests"][b["requests"] > 0]
    spread = (f" The busiest replica got {counts.max() / counts.min():.2f}x the requests of the least busy."
              if counts.size > 1 else "")
    return Chart("balance", title,
                 "Per replica: the requests the router sent it, how much of the run its engine was busy, and "
                 f"its completed requests' p99 TTFT. Balanced routing gives equal bars.{spread}", fig, 360)


def _binned_quantiles(x: np.ndarray, y: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """``q``-quantile of ``y`` in log-spaced bins of ``x`` (bins with fewer than 5 requests left out)."""
    edges = np.unique(np.geomspace(max(x.min(), 1.0), x.max() + 1, LENGTH_BINS + 1))
    centers, values = [], []
    which = np.digitize(x, edges) - 1
    for i in range(len(edges) - 1):
        sel = which == i
        if sel.sum() >= 5:
            centers.append(np.sqrt(edges[i] * edges[i + 1]))
            values.append(np.quantile(y[sel], q))
    return np.asarray(centers), np.asarray(values)


def ttft_prompt_chart(data: RunData, checks: list[SloCheck]) -> Chart:
    title = "TTFT against prompt length"
    done = data.completed()
    if not len(done) or done["prompt_tokens"].isna().all():
        return Chart("ttft_prompt", title,
                     "This run's requests.parquet has no completed request with a prompt length.", None, 0)
    x = done["prompt_tokens"].to_numpy(float)
    y = done["ttft_s"].to_numpy(float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[keep], y[keep]
    sample = np.arange(x.size) if x.size <= MAX_POINTS else np.linspace(0, x.size - 1, MAX_POINTS).astype(int)
    fig = go.Figure()
    fig.add_trace(go.Scattergl(x=f32(x[sample]), y=f32(y[sample]), mode="markers", name="requests",
                               marker={"size": 4, "opacity": 0.35, "color": "#1f77b4"},
                               hovertemplate="%{x:,.0f} prompt tokens: TTFT %{y:.4g} s<extra></extra>"))
    for q, name, color in ((0.5, "p50", "#2ca02c"), (0.99, "p99", "#d62728")):
        cx, cy = _binned_quantiles(x, y, q)
        fig.add_trace(go.Scatter(x=f32(cx), y=f32(cy), mode="lines+markers", name=f"{name} per length bin",
                                 line={"color": color},
                                 hovertemplate=f"~%{{x:,.0f}} tokens: {name} TTFT %{{y:.4g}} s"
                                               "<extra></extra>"))
    limit = next((c.limit_s for c in checks if c.metric.key == "ttft_s"), None)
    if limit is not None:
        fig.add_hline(y=limit, line={"dash": "dash", "color": "#d62728"},
                      annotation_text=f"SLO {fmt_latency(limit, METRICS['ttft_s'].unit)}",
                      annotation_font_color="#d62728")
    fig.update_xaxes(title_text="prompt tokens", type="log")
    fig.update_yaxes(title_text="TTFT (s)", rangemode="tozero")
    fig.update_layout(template=TEMPLATE, height=440, legend={"x": 0, "y": 1.0, "yanchor": "top"})
    shown = "every" if sample.size == x.size else f"{sample.size:,} of {x.size:,} (evenly spread)"
    return Chart("ttft_prompt", title,
                 f"One point per completed request ({shown}); lines: p50 and p99 TTFT in log-spaced prompt "
                 "length bins. TTFT that rises with the prompt is prefill time; TTFT high at every length "
                 "is time spent waiting.", fig, 440)
