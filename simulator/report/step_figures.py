"""Where the engine's time goes: the steps on a roofline, and the time per operator class.

Both charts read only ``steps.parquet``: ``flops`` and ``hbm_bytes`` (per GPU of the TP group, as
the cost model prices one shard) for the roofline, and the ``op_*_s`` columns (seconds per
operator class, summing to ``duration_s``) for the breakdown. The roofline follows Williams,
Waterman and Patterson (CACM 2009): attainable FLOP/s = min(peak, bandwidth x intensity).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servesim.report.figures import MAX_SCATTER_POINTS, TEMPLATE, Chart, f32, sample_steps
from servesim.report.hardware_roof import Roof
from servesim.report.run_data import OP_COLUMNS, RunData

STEP_KINDS = ("prefill only", "decode only", "mixed")
KIND_COLORS = {"prefill only": "#d62728", "decode only": "#1f77b4", "mixed": "#9467bd"}
OP_LABELS = {"op_gemm_s": "GEMMs (QKV, O, MLP/MoE, LM head)", "op_attn_prefill_s": "attention, prefill",
             "op_attn_decode_s": "attention, decode", "op_elementwise_s": "elementwise and norms",
             "op_communication_s": "TP communication", "op_overhead_s": "step overhead",
             "op_proposal_s": "speculative proposals"}
OP_COLORS = {"op_gemm_s": "#1f77b4", "op_attn_prefill_s": "#d62728", "op_attn_decode_s": "#ff7f0e",
             "op_elementwise_s": "#2ca02c", "op_communication_s": "#9467bd", "op_overhead_s": "#7f7f7f",
             "op_proposal_s": "#bcbd22"}


def step_kinds(num_prefills: np.ndarray, num_decodes: np.ndarray) -> np.ndarray:
    """Each step's kind: only prefill chunks, only decodes, or both (chunked-prefill style)."""
    prefills, decodes = np.asarray(num_prefills) > 0, np.asarray(num_decodes) > 0
    return np.where(prefills & decodes, "mixed", np.where(prefills, "prefill only", "decode only"))


# ---------------------------------------------------------------- roofline


def roofline_points(data: RunData, tp: int) -> dict[str, np.ndarray]:
    """Per step with work: intensity (FLOP/byte) and achieved FLOP/s of the whole TP group."""
    s = data.steps
    flops, nbytes = s["flops"].to_numpy(float), s["hbm_bytes"].to_numpy(float)
    duration = s["duration_s"].to_numpy(float)
    ok = np.isfinite(flops) & np.isfinite(nbytes) & (flops > 0) & (nbytes > 0) & (duration > 0)
    idx = np.flatnonzero(ok)
    return {"index": idx, "intensity": flops[idx] / nbytes[idx],
            "flops_per_s": tp * flops[idx] / duration[idx]}


def _roof_traces(roof: Roof, x_lo: float, x_hi: float) -> list[go.Scatter]:
    group_bw, group_peak = roof.tp * roof.bandwidth_Bps, roof.tp * roof.peak_flops
    label = f"{roof.hardware}{f' × {roof.tp}' if roof.tp > 1 else ''}"
    x_lo, x_hi = min(x_lo, roof.ridge / 10), max(x_hi, roof.ridge * 10)
    traces = [go.Scatter(
        x=[x_lo, roof.ridge, x_hi], y=[group_bw * x_lo / 1e12, group_peak / 1e12, group_peak / 1e12],
        mode="lines", name=f"roof: {label}, {roof.math_dtype}", line={"color": "#222", "width": 2},
        hovertemplate=(f"roof at %{{x:.3g}} FLOP/B: %{{y:,.0f}} TFLOP/s<br>HBM {group_bw / 1e12:.3g} "
                       f"TB/s, peak {group_peak / 1e12:,.0f} TFLOP/s ({roof.math_dtype}), ridge "
                       f"{roof.ridge:.0f} FLOP/B<extra></extra>"))]
    if roof.bf16_peak_flops != roof.peak_flops:
        ridge16 = roof.bf16_peak_flops / roof.bandwidth_Bps
        peak16 = roof.tp * roof.bf16_peak_flops
        traces.append(go.Scatter(
            x=[ridge16, x_hi], y=[peak16 / 1e12, peak16 / 1e12], mode="lines", name="bf16 roof (attention)",
            line={"color": "#222", "width": 1, "dash": "dot"},
            hovertemplate=(f"bf16 peak {peak16 / 1e12:,.0f} TFLOP/s, ridge {ridge16:.0f} FLOP/B"
                           "<extra></extra>")))
    return traces


def roofline_chart(data: RunData, roof: Roof | str) -> Chart:
    """Each step's arithmetic intensity against the FLOP/s it achieved, under the hardware roof."""
    tp = roof.tp if isinstance(roof, Roof) else 1
    pts = roofline_points(data, tp)
    s = data.steps
    idx = pts["index"]
    keep = sample_steps(s["duration_s"].to_numpy(float)[idx], MAX_SCATTER_POINTS)
    rows = idx[keep]
    intensity, achieved = pts["intensity"][keep], pts["flops_per_s"][keep]
    kinds = step_kinds(s["num_prefills"].to_numpy()[rows], s["num_decodes"].to_numpy()[rows])
    group_peak = roof.tp * roof.peak_flops if isinstance(roof, Roof) else np.nan
    attainable = (np.minimum(group_peak, roof.tp * roof.bandwidth_Bps * intensity)
                  if isinstance(roof, Roof) else np.full(intensity.size, np.nan))
    custom = np.column_stack([
        s["duration_s"].to_numpy(float)[rows] * 1e3,
        (s["prefill_tokens"] + s["decode_tokens"]).to_numpy(float)[rows],
        s["num_prefills"].to_numpy(float)[rows], s["num_decodes"].to_numpy(float)[rows],
        100 * achieved / group_peak, 100 * achieved / attainable,
        s["replica"].to_numpy(float)[rows], s["start_s"].to_numpy(float)[rows],
    ])
    bound = s["bound"].astype(str).to_numpy()[rows]
    fig = go.Figure()
    if isinstance(roof, Roof):
        lo = float(intensity.min()) / 2 if intensity.size else 1.0
        hi = float(intensity.max()) * 2 if intensity.size else 1e3
        for trace in _roof_traces(roof, lo, hi):
            fig.add_trace(trace)
        # The ridge as a trace (shapes and annotations take log10 coordinates on log axes).
        y_lo = float(achieved.min()) / 1e12 if achieved.size else group_peak / 1e14
        fig.add_trace(go.Scatter(
            x=[roof.ridge, roof.ridge], y=[y_lo, roof.tp * roof.peak_flops / 1e12], mode="lines+text",
            text=["", f"ridge {roof.ridge:.0f} FLOP/B "], textposition="top left", showlegend=False,
            line={"dash": "dot", "color": "#999", "width": 1}, textfont={"color": "#666"},
            hovertemplate=f"ridge point: {roof.ridge:.0f} FLOP/B<extra></extra>"))
    roof_share = ("<br>%{customdata[4]:.1f}% of peak, %{customdata[5]:.1f}% of the roof at this intensity"
                  if isinstance(roof, Roof) else "")
    for kind in STEP_KINDS:
        sel = kinds == kind
        if not sel.any():
            continue
        fig.add_trace(go.Scattergl(
            x=f32(intensity[sel]), y=f32(achieved[sel] / 1e12), customdata=f32(custom[sel]), text=bound[sel],
            mode="markers", name=kind, marker={"size": 5, "opacity": 0.6, "color": KIND_COLORS[kind]},
            hovertemplate=("%{x:.3g} FLOP/B, %{y:.4g} TFLOP/s" + roof_share +
                           "<br>step %{customdata[0]:.3g} ms, %{customdata[1]:,.0f} tokens "
                           "(%{customdata[2]:.0f} prefills, %{customdata[3]:.0f} decodes), %{text}-bound"
                           "<br>replica %{customdata[6]:.0f} at t %{customdata[7]:.4g} s"
                           f"<extra>{kind}</extra>"),
        ))
    fig.update_xaxes(title_text="arithmetic intensity (FLOPs per HBM byte, whole step)", type="log")
    fig.update_yaxes(title_text="achieved TFLOP/s" + (f" (TP group of {tp})" if tp > 1 else ""), type="log")
    fig.update_layout(template=TEMPLATE, height=480, legend={"x": 0.0, "y": 1.02}, margin={"t": 60})
    shown = ("all" if rows.size == idx.size
             else f"{rows.size:,} of {idx.size:,} (evenly spread, plus the slowest)")
    if isinstance(roof, Roof):
        where = (f"Black: the roof of {roof.hardware}{f' × TP {tp}' if tp > 1 else ''}, "
                 f"min(peak {roof.math_dtype} FLOP/s, HBM bandwidth × intensity), ridge at "
                 f"{roof.ridge:.0f} FLOP/B.")
    else:
        where = f"No roof drawn: {roof}."
    caption = (f"One point per engine step ({shown} steps with work): FLOPs over HBM bytes against "
               f"FLOPs over the step's wall time, both summed over the TP group. {where} Steps sit below "
               "the roof by the "
               "efficiencies, kernel launch floors, communication and the fixed step overhead.")
    return Chart("roofline", "Steps on the roofline", caption, fig, 480)


# ---------------------------------------------------------------- operator breakdown


def op_totals(data: RunData) -> dict[str, dict[str, float]]:
    """Seconds per operator column, per step kind and over all steps; plus step counts (``steps``)."""
    s = data.steps
    kinds = step_kinds(s["num_prefills"].to_numpy(), s["num_decodes"].to_numpy())
    values = s[list(OP_COLUMNS)].to_numpy(float)
    out: dict[str, dict[str, float]] = {}
    for kind in ("all steps", *STEP_KINDS):
        sel = np.ones(len(s), dtype=bool) if kind == "all steps" else kinds == kind
        totals = np.nansum(values[sel], axis=0) if sel.any() else np.zeros(len(OP_COLUMNS))
        out[kind] = {**dict(zip(OP_COLUMNS, totals.tolist(), strict=True)), "steps": float(sel.sum())}
    return out


def has_op_columns(data: RunData) -> bool:
    """False for a run written before the engine recorded operator classes (the columns are NaN)."""
    return bool(np.isfinite(data.steps[list(OP_COLUMNS)].to_numpy(float)).all())


def op_breakdown_chart(data: RunData) -> Chart:
    """Stacked time per operator class: total seconds, and mean milliseconds per step, by step kind."""
    totals = op_totals(data)
    kinds = [k for k in totals if totals[k]["steps"] > 0] or ["all steps"]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1)
    for column in OP_COLUMNS:
        seconds = np.array([totals[k][column] for k in kinds])
        if not seconds.any() and column != "op_gemm_s":  # e.g. no TP: no communication to show
            continue
        steps = np.array([totals[k]["steps"] for k in kinds])
        kind_total = np.array([sum(totals[k][c] for c in OP_COLUMNS) for k in kinds])
        share = np.divide(100 * seconds, kind_total, out=np.zeros_like(seconds), where=kind_total > 0)
        mean_ms = np.divide(1e3 * seconds, steps, out=np.zeros_like(seconds), where=steps > 0)
        custom = np.column_stack([share, mean_ms, seconds, steps])
        label = OP_LABELS[column]
        hover = ("%{x}: %{customdata[2]:.4g} s in " + label + "<br>%{customdata[0]:.1f}% of these "
                 "steps' time, %{customdata[1]:.3g} ms per step over %{customdata[3]:,.0f} steps"
                 "<extra></extra>")
        for col, y in ((1, seconds), (2, mean_ms)):
            fig.add_trace(go.Bar(x=kinds, y=y, name=label, legendgroup=column, showlegend=col == 1,
                                 marker_color=OP_COLORS[column], customdata=custom, hovertemplate=hover),
                          row=1, col=col)
    fig.update_layout(template=TEMPLATE, barmode="stack", height=460, margin={"t": 60})
    fig.update_yaxes(title_text="total time (s, summed over steps)", row=1, col=1)
    fig.update_yaxes(title_text="mean time per step (ms)", row=1, col=2)
    all_total = sum(totals["all steps"][c] for c in OP_COLUMNS)
    top = max(OP_COLUMNS, key=lambda c: totals["all steps"][c])
    lead = (f"{OP_LABELS[top]} take {100 * totals['all steps'][top] / all_total:.0f}% of the busy time. "
            if all_total > 0 else "")
    return Chart("operators", "Time per operator class",
                 f"{lead}Seconds per operator class from the cost model, summed over the steps of "
                 "every replica (left) and per step (right), for all steps and by kind of step. Each class "
                 "includes its kernels' launch floors; the classes add up to the step time.", fig, 460)
