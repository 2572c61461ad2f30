"""``servesim calibrate validate-serving`` and ``fit-serving``: the simulator against measured
deployments of whole engines.

Every row of a serving file (:mod:`servesim.calibration.serving_data`) the simulator can express is
replayed as its experiment: ``concurrency`` closed-loop clients each sending ``warmup +
measured`` requests; the first ``warmup`` rounds warm the system up (as ``aiperf
--warmup-request-count`` does) and the mean TTFT and TPOT of the rest are the prediction. The
schedule is traced once per row with the engine's CPU work set to zero
(:mod:`servesim.calibration.replay`), so predicting with any CPU coefficients, fitting them, and
leave-one-model-out all reuse it.

``validate-serving`` predicts with the engines as shipped and writes ``serving_rows.csv``,
``serving_summary.csv``, ``serving_skipped.csv`` and ``serving.html`` (predicted vs measured,
coloured by engine). ``fit-serving`` fits each engine's CPU coefficients on all its rows, reports
the leave-one-model-out error (each model predicted from a fit to the others) and writes
``configs/engines/<engine>.yaml``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.atomic_io import atomic_write_text
from servesim.calibration.engine_fit import Measurement, fit, leave_one_model_out
from servesim.calibration.replay import ZERO_CPU, Coefficients, ScheduleTrace, simulate_document, trace_run
from servesim.calibration.serving_data import HARDWARE, ServingFile, ServingRow, read_serving_file
from servesim.engines import make_engine
from servesim.errors import ServesimError

WARMUP = 1
MEASURED = 3
FIT_PARAMS = ("fixed_s", "per_seq_s")
FIT_METRICS = ("tpot",)
"""The CPU work per step sets the step time, which TPOT measures directly; a closed loop's TTFT
is mostly queueing and prefill, set by the scheduler (and by engine flags the file does not
record), so TTFT validates the fit instead of steering it."""


@dataclass(frozen=True)
class TracedRow:
    row: ServingRow
    trace: ScheduleTrace | None
    problem: str | None

    def measurement(self, warmup: int) -> Measurement:
        assert self.trace is not None
        first = warmup * self.row.concurrency
        requests = np.arange(first, self.trace.done.size)
        return Measurement(self.trace, requests, np.array([self.row.ttft_s]), np.array([self.row.tpot_s]),
                           group=self.row.model)


def _trace(args: tuple[ServingRow, int]) -> TracedRow:
    row, per_client = args
    try:
        result = simulate_document(row.document(per_client, ZERO_CPU))
    except ServesimError as exc:
        return TracedRow(row, None, f"the simulator refuses the deployment: {exc}")
    return TracedRow(row, trace_run(result), None)


def trace_rows(rows: Iterable[ServingRow], warmup: int = WARMUP, measured: int = MEASURED,
               workers: int = 1) -> list[TracedRow]:
    """Every row's schedule (in file order); ``workers`` processes."""
    jobs = [(row, warmup + measured) for row in rows]
    if workers <= 1:
        return [_trace(job) for job in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_trace, jobs, chunksize=1))


def shipped_coefficients(engine: str, hardware: str) -> Coefficients:
    """The engine's CPU coefficients as ``servesim run`` would use them on ``hardware``."""
    cpu = make_engine(engine, {}).cpu(hardware)
    return Coefficients(cpu.fixed_s, cpu.per_seq_s, cpu.per_token_s)


def prediction_rows(traced: list[TracedRow], coefficients: dict[int, Coefficients], warmup: int,
                    label: str) -> pd.DataFrame:
    """One line per replayed row: measured and predicted TTFT and TPOT, and their errors."""
    lines = []
    for t in traced:
        if t.trace is None:
            continue
        m = t.measurement(warmup)
        ttft, tpot = m.predicted(coefficients[t.row.row])
        r = t.row
        lines.append({"row": r.row, "engine": r.engine, "gpu": r.gpu, "model": r.hf_model, "tp": r.tp,
                      "precision": r.precision, "isl": r.isl, "osl": r.osl, "concurrency": r.concurrency,
                      "measured_ttft_ms": r.ttft_s * 1e3, "measured_tpot_ms": r.tpot_s * 1e3,
                      "predicted_ttft_ms": float(ttft[0]) * 1e3, "predicted_tpot_ms": float(tpot[0]) * 1e3,
                      "prediction": label})
    frame = pd.DataFrame(lines)
    if len(frame):
        frame["ttft_ape_%"] = (frame["predicted_ttft_ms"] / frame["measured_ttft_ms"] - 1).abs() * 100
        frame["tpot_ape_%"] = (frame["predicted_tpot_ms"] / frame["measured_tpot_ms"] - 1).abs() * 100
    return frame


def summarise(rows: pd.DataFrame, total_rows: int) -> pd.DataFrame:
    """Per engine and GPU (and all together): rows, median APE of TTFT and TPOT, and the share of
    rows with TPOT within 10% and TTFT within 20%."""
    out = []
    groups = [(("all", "all"), rows), *rows.groupby(["engine", "gpu"])]
    for (engine, gpu), group in groups:
        within = (group["tpot_ape_%"] <= 10) & (group["ttft_ape_%"] <= 20)
        out.append({"engine": engine, "gpu": gpu, "rows": len(group),
                    "share_of_file_%": 100 * len(group) / total_rows if total_rows else float("nan"),
                    "ttft_median_ape_%": group["ttft_ape_%"].median(),
                    "tpot_median_ape_%": group["tpot_ape_%"].median(),
                    "ttft_p90_ape_%": group["ttft_ape_%"].quantile(0.9),
                    "tpot_p90_ape_%": group["tpot_ape_%"].quantile(0.9),
                    "within_tpot10_ttft20_%": 100 * within.mean()})
    return pd.DataFrame(out)


def skipped_table(data: ServingFile, traced: list[TracedRow]) -> pd.DataFrame:
    refused = pd.DataFrame([{"row": t.row.row, "backend": t.row.engine, "model": t.row.hf_model,
                             "system": t.row.gpu, "reason": t.problem} for t in traced if t.trace is None],
                           columns=["row", "backend", "model", "system", "reason"])
    return pd.concat([data.skipped, refused], ignore_index=True).sort_values("row")


def chart(rows: pd.DataFrame, title: str, path: Path) -> None:
    """Predicted vs measured TTFT and TPOT (log-log), coloured by engine."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT (ms)", "TPOT (ms)"))
    colours = {"vllm": "#1f77b4", "sglang": "#d62728", "trtllm": "#2ca02c"}
    for col, metric in ((1, "ttft"), (2, "tpot")):
        for engine, group in rows.groupby("engine"):
            fig.add_trace(go.Scatter(
                x=group[f"measured_{metric}_ms"], y=group[f"predicted_{metric}_ms"], mode="markers",
                name=str(engine), legendgroup=str(engine), showlegend=col == 1,
                marker={"color": colours.get(str(engine), "gray"), "size": 6, "opacity": 0.7},
                text=[f"row {r.row}: {r.model} {r.gpu} tp{r.tp} {r.isl}/{r.osl} c{r.concurrency}"
                      for r in group.itertuples()]), row=1, col=col)
        values = rows[[f"measured_{metric}_ms", f"predicted_{metric}_ms"]].to_numpy()
        lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", showlegend=False,
                                 line={"dash": "dash", "color": "gray"}), row=1, col=col)
        fig.update_xaxes(type="log", title="measured", row=1, col=col)
        fig.update_yaxes(type="log", title="predicted", row=1, col=col)
    fig.update_layout(title=title, template="plotly_white")
    atomic_write_text(path, fig.to_html(include_plotlyjs=True, full_html=True))


def write_outputs(out: Path, rows: pd.DataFrame, summary: pd.DataFrame, skipped: pd.DataFrame,
                  title: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "serving_rows.csv", rows.to_csv(index=False))
    atomic_write_text(out / "serving_summary.csv", summary.to_csv(index=False))
    atomic_write_text(out / "serving_skipped.csv", skipped.to_csv(index=False))
    if len(rows):
        chart(rows, title, out / "serving.html")


def validate_serving(path: Path, out: Path | None = None, workers: int = 1, warmup: int = WARMUP,
                     measured: int = MEASURED) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Predicted vs measured for every expressible row of ``path``, with the engines as shipped:
    (rows, summary, skipped rows with reasons)."""
    data = read_serving_file(path)
    traced = trace_rows(data.rows, warmup, measured, workers)
    coefficients = {t.row.row: shipped_coefficients(t.row.engine, HARDWARE[t.row.gpu]) for t in traced}
    rows = prediction_rows(traced, coefficients, warmup, "shipped")
    unique = data.total - data.duplicates
    summary = summarise(rows, unique)
    skipped = skipped_table(data, traced)
    if out is not None:
        write_outputs(Path(out), rows, summary, skipped, f"{Path(path).name}: servesim vs measured")
    return rows, summary, skipped


@dataclass
class ServingFit:
    """Per engine: coefficients fitted on all rows, and the leave-one-model-out predictions."""

    coefficients: dict[str, Coefficients]
    lomo_rows: pd.DataFrame
    lomo_summary: pd.DataFrame
    skipped: pd.DataFrame
    rows_used: dict[str, int]


def fit_serving(path: Path, workers: int = 1, warmup: int = WARMUP, measured: int = MEASURED,
                engines: tuple[str, ...] = ("vllm", "sglang", "trtllm")) -> ServingFit:
    """Each engine's CPU coefficients fitted to its rows of ``path``, and the leave-one-model-out
    error of that fit."""
    data = read_serving_file(path)
    traced = trace_rows([r for r in data.rows if r.engine in engines], warmup, measured, workers)
    fitted: dict[str, Coefficients] = {}
    lomo: dict[int, Coefficients] = {}
    used: dict[str, int] = {}
    for engine in engines:
        mine = [t for t in traced if t.row.engine == engine and t.trace is not None]
        used[engine] = len(mine)
        if not mine:
            continue
        measurements = [t.measurement(warmup) for t in mine]
        fitted[engine] = fit(measurements, FIT_PARAMS, metrics=FIT_METRICS)
        per_model = leave_one_model_out(measurements, FIT_PARAMS, FIT_METRICS)
        for t in mine:
            lomo[t.row.row] = per_model[t.row.model]
    rows = prediction_rows([t for t in traced if t.row.row in lomo], lomo, warmup, "leave-one-model-out")
    return ServingFit(fitted, rows, summarise(rows, data.total - data.duplicates),
                      skipped_table(data, traced), used)


def runtime_profile_yaml(engine: str, c: Coefficients, provenance: str) -> str:
    """An engine runtime profile (``configs/engines/<engine>.yaml`` or ``engine.profile``)."""
    import yaml

    entry = {"fixed_s": float(f"{c.fixed_s:.4g}"), "per_seq_s": float(f"{c.per_seq_s:.4g}"),
             "per_token_s": float(f"{c.per_token_s:.4g}"), "per_sample_s": 0.0, "provenance": provenance}
    return yaml.safe_dump({"engine": engine, "cpu_costs": {"default": entry}}, sort_keys=False, width=100)


def write_engine_fits(result: ServingFit, source: str, out_dir: Path, date: str | None = None) -> list[Path]:
    """``<out_dir>/<engine>.yaml`` for every fitted engine, with the fit's provenance."""
    date = date or dt.date.today().isoformat()
    written = []
    for engine, c in result.coefficients.items():
        lomo = result.lomo_summary
        part = lomo[(lomo["engine"] == engine)] if len(lomo) else lomo
        errors = "; ".join(f"{r['gpu']}: {r['rows']} rows, TTFT median {r['ttft_median_ape_%']:.1f}%, "
                           f"TPOT median {r['tpot_median_ape_%']:.1f}%" for _, r in part.iterrows())
        provenance = (f"fitted {date} by servesim calibrate fit-serving to the mean TPOT of "
                      f"{result.rows_used[engine]} measured closed-loop deployments of {source} (CPU "
                      f"time per step and per scheduled sequence, other coefficients 0; with the "
                      f"kernels fixed, it also absorbs what the kernels' prices miss end to end, so "
                      f"it is an effective cost, larger than a profiler would show); "
                      f"leave-one-model-out median APE by GPU: {errors or 'n/a'}")
        path = Path(out_dir) / f"{engine}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, runtime_profile_yaml(engine, c, provenance))
        written.append(path)
    return written
