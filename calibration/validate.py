"""``servesim calibrate validate``: predicted vs measured time per kernel family.

For every measured row the simulator's own cost functions price the kernel with the given
profile (and with its bare spec-sheet roofline, for comparison). The summary gives the median
and p90 absolute percentage error per family, over the held-out rows (every other value of the
family's shape axis, never seen by ``fit``) and over all rows; the per-row table and a plotly
chart (predicted vs measured, log-log) are written next to it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from servesim.atomic_io import atomic_write
from servesim.calibration.profile_fit import error_stats
from servesim.calibration.schema import FAMILIES, holdout_mask, read_measurements
from servesim.calibration.vidur import gpu_of, vidur_tables
from servesim.calibration.work import ape, predict, usable
from servesim.engines.base import AllReduceKind
from servesim.hardware import HardwareProfile

COLLECTIVE_FAMILIES: dict[str, tuple[str, AllReduceKind]] = {
    "allreduce_vllm": ("custom_allreduce", "custom"), "allreduce_nccl": ("nccl", "nccl")}
"""The all-reduce as serving engines run it (``servesim.cost.communication.allreduce_s``), beside
the ``allreduce`` family's ring model (servesim 0.1's, ``allreduce: ring``): family -> (the
AIConfigurator table it is measured in, the runtime's ``allreduce`` kind). ``allreduce_vllm`` is
vLLM's own all-reduce (its custom one-shot / two-shot kernels, then symmetric memory, NCCL
above: vLLM's size rule for the GPU), ``allreduce_nccl`` nccl-tests' all-reduce (SGLang's and TensorRT-LLM's
large messages)."""


def load_tables(source: Path, profile: HardwareProfile) -> dict[str, pd.DataFrame]:
    """A bench output folder, the public ``vidur_profiling`` folder or AIConfigurator's
    ``kernels/aiconfigurator`` folder (the GPU from the profile; with its all-reduce tables as the
    :data:`COLLECTIVE_FAMILIES`)."""
    source = Path(source)
    if (source / "compute").is_dir():
        return vidur_tables(source, gpu_of(profile.name))
    if (source / "systems").is_dir():
        from servesim.calibration.aiconfigurator import aic_system_of, aic_tables

        tables = aic_tables(source, aic_system_of(profile.name)).tables
        out = {k: v for k, v in tables.items() if k in FAMILIES}
        for family, (table, _) in COLLECTIVE_FAMILIES.items():
            if table in tables and not tables[table].empty:
                out[family] = tables[table]
        return out
    return read_measurements(source)


def collective_rows(family: str, table: pd.DataFrame, profile: HardwareProfile) -> pd.DataFrame:
    """Rows of a :data:`COLLECTIVE_FAMILIES` family: each measured all-reduce priced as the engines
    price it with ``profile`` (its fitted ``collectives``), and with the bare spec-sheet ring
    model; held out as the collective fit holds them out (``calibration/collective_fit.py``)."""
    from servesim.calibration.collective_fit import VLLM_RUNTIME, engine_allreduce_times
    from servesim.cost.communication import ring_allreduce_s
    from servesim.engines.base import RuntimeCosts

    kind = COLLECTIVE_FAMILIES[family][1]
    runtime = VLLM_RUNTIME if kind == "custom" else RuntimeCosts(allreduce=kind)
    message, world = table["bytes"].to_numpy(float), table["world"].to_numpy(int)
    spec = profile.ideal().interconnect
    pairs = list(zip(message.tolist(), world.tolist(), strict=True))
    return pd.DataFrame({
        "family": family, "measured_s": table["time_s"].to_numpy(float),
        "predicted_s": engine_allreduce_times(table, profile, runtime),
        "spec_roofline_s": [ring_allreduce_s(b, w, spec) for b, w in pairs],
        "held_out": holdout_mask(table, "allreduce"), "bytes": message, "world": world})


def by_gemm_format(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """``tables`` with a GEMM table's fp8 and nvfp4 rows as ``gemm_fp8`` and ``gemm_fp4`` families
    of their own: the cost model prices low-precision math with the profile's class for it
    (``Efficiency.gemm_for``), so they are validated against it, not against the bf16 curve at
    their peak."""
    gemm = tables.get("gemm")
    if gemm is None or "dtype" not in gemm.columns:
        return tables
    dtypes = gemm["dtype"].astype(str)
    formats = {family: (dtypes == dtype).to_numpy()
               for family, dtype in (("gemm_fp8", "fp8"), ("gemm_fp4", "nvfp4"))
               if family not in tables and (dtypes == dtype).any()}
    if not formats:
        return tables
    split = {family: table for family, table in tables.items() if family != "gemm"}
    rest = ~np.logical_or.reduce(list(formats.values()))
    if rest.any():
        split["gemm"] = gemm[rest].reset_index(drop=True)
    for family, rows in formats.items():
        split[family] = gemm[rows].reset_index(drop=True)
    return split


def predictions(tables: dict[str, pd.DataFrame], profile: HardwareProfile) -> pd.DataFrame:
    frames = []
    spec = profile.ideal()
    for family, raw in by_gemm_format(tables).items():
        if family in COLLECTIVE_FAMILIES:
            frames.append(collective_rows(family, raw, profile))
            continue
        table = usable(family, raw, profile)
        if table.empty:
            continue
        frame = pd.DataFrame({"family": family, "measured_s": table["time_s"].to_numpy(float),
                              "predicted_s": predict(family, table, profile),
                              "spec_roofline_s": predict(family, table, spec),
                              "held_out": holdout_mask(table, family)})
        shape_cols = [c for c in ("m", "n", "k", "dtype", "batch", "seq", "context", "heads",
                                  "kv_heads", "head_dim", "kv_bytes", "bytes", "world") if c in table.columns]
        frames.append(pd.concat([frame, table[shape_cols].reset_index(drop=True)], axis=1))
    rows = pd.concat(frames, ignore_index=True)
    measured = rows["measured_s"].to_numpy()
    rows["ape"] = ape(rows["predicted_s"].to_numpy(), measured)
    rows["spec_ape"] = ape(rows["spec_roofline_s"].to_numpy(), measured)
    return rows


def summarise(rows: pd.DataFrame, profile: str) -> pd.DataFrame:
    out = []
    for family, group in rows.groupby("family", sort=False):
        held = group["held_out"].to_numpy()
        line: dict[str, object] = {"profile": profile, "family": family, "rows": len(group),
                                   "held_out": int(held.sum())}
        line["held_out_median_%"], line["held_out_p90_%"] = error_stats(group["ape"].to_numpy()[held])
        line["all_median_%"], line["all_p90_%"] = error_stats(group["ape"].to_numpy())
        line["spec_median_%"], line["spec_p90_%"] = error_stats(group["spec_ape"].to_numpy()[held])
        out.append(line)
    return pd.DataFrame(out)


def chart(rows: pd.DataFrame, title: str, path: Path) -> Path:
    import plotly.graph_objects as go

    fig = go.Figure()
    for (family, held), group in rows.groupby(["family", "held_out"], sort=False):
        fig.add_trace(go.Scattergl(
            x=group["measured_s"] * 1e6, y=group["predicted_s"] * 1e6, mode="markers",
            name=f"{family} ({'held out' if held else 'fitted'})", marker={"size": 4, "opacity": 0.6}))
    lo = float(rows[["measured_s", "predicted_s"]].min().min() * 1e6)
    hi = float(rows[["measured_s", "predicted_s"]].max().max() * 1e6)
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="exact",
                             line={"dash": "dash", "color": "gray"}))
    fig.update_layout(title=title, xaxis={"type": "log", "title": "measured (us)"},
                      yaxis={"type": "log", "title": "predicted (us)"}, template="plotly_white")
    fig.write_html(path, include_plotlyjs="cdn")
    return path


def validate(source: Path, profile: HardwareProfile, out: Path | None = None,
             ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The summary and per-row tables; with ``out``, also ``validation_summary.csv``,
    ``validation_rows.csv`` and ``validation.html`` there."""
    rows = predictions(load_tables(source, profile), profile)
    summary = summarise(rows, profile.name)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "validation_summary.csv", lambda tmp: summary.to_csv(tmp, index=False))
        atomic_write(out / "validation_rows.csv", lambda tmp: rows.to_csv(tmp, index=False))
        chart(rows, f"{profile.name}: predicted vs measured kernel time", out / "validation.html")
    return summary, rows


def overall(summary: pd.DataFrame) -> float:
    """Median of the per-family held-out medians (one number for a quick check)."""
    return float(np.nanmedian(summary["held_out_median_%"].to_numpy(float)))
