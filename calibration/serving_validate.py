"""``servesim calibrate validate-serving`` and ``fit-serving``: the simulator against measured
deployments of whole engines.

Every row of a serving file (:mod:`servesim.calibration.serving_data`) the simulator can express is
replayed as its experiment: ``concurrency`` closed-loop clients each sending ``warmup +
measured`` requests; the first ``warmup`` rounds warm the system up (as ``aiperf
--warmup-request-count`` does) and the mean TTFT and TPOT of the rest are the prediction.

How the benchmark ran (AIConfigurator's ``bench_run.sh.j2``: ``aiperf profile --concurrency N
--num-requests 20N --warmup-request-count 2N``, ISL/OSL standard deviations 0 by default): aiperf
waits for every warm-up response before it starts profiling (its ``docs/tutorials/warmup.md``),
so the profiled phase starts, like the replay, with all N clients sending at once, and fixed
lengths keep them in phase from then on in the replay as in the benchmark; that lock-step is the
benchmark's, not an artefact. The simulator has no cold start (no compilation, no cache state
carried over: the prefix cache is off), so a drained warm-up leaves nothing behind and the
replay's first round *is* the profiled phase's first round: it counts as 1/20 of the mean
(:data:`PROFILED_ROUNDS`), and the ``measured`` rounds after it stand for the other 19, the steady
state. (Before, the first round was discarded as a warm-up: the same when the clients stay in
lock-step, lower where prefill chunking spreads the first round's prompts out.)

A single-group deployment's schedule is traced once per row with the engine's CPU work set to
zero and a 10 us front end (:data:`~servesim.calibration.replay.TRACE_FRONTEND_S`: a request enters
just after its client sends it, never in the step that starts at that instant), so predicting with
any CPU coefficients and front-end latency, fitting them, and leave-one-model-out all reuse it
(:mod:`servesim.calibration.replay`). Deployments of several scheduling units (disaggregated
groups, data-parallel attention ranks, pipeline stages) have no single step sequence to re-time:
they are simulated once per set of coefficients (``simulated`` in the rows' ``replay`` column),
predicted but not fitted.

``validate-serving`` predicts with the engines as shipped and writes ``serving_rows.csv``,
``serving_summary.csv``, ``serving_skipped.csv`` and ``serving.html`` (predicted vs measured,
coloured by engine). ``fit-serving`` fits each engine's CPU coefficients on all its rows, reports
the leave-one-model-out error (each model predicted from a fit to the others) and writes
``configs/engines/<engine>.yaml``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servesim.atomic_io import atomic_write_text
from servesim.calibration.engine_fit import (
    FRONT_END_MAX_CONCURRENCY,
    Measurement,
    fit,
    leave_one_model_out,
    weighted_mean,
)
from servesim.calibration.replay import (
    TRACE_FRONTEND_S,
    ZERO_CPU,
    Coefficients,
    ScheduleTrace,
    retimes_exactly,
    simulate_document,
    trace_run,
)
from servesim.calibration.replay_pool import replay_map
from servesim.calibration.serving_data import HARDWARE, ServingFile, ServingRow, read_serving_file
from servesim.calibration.serving_noise import replayed_noise
from servesim.config import validate_document
from servesim.engines import make_engine
from servesim.errors import ServesimError
from servesim.pipeline import prepare

WARMUP = 1
"""Rounds the profiled phase starts with, all clients sending at once."""
MEASURED = 3
"""Simulated rounds after it, standing for the steady state."""
PROFILED_ROUNDS = 20
"""aiperf ``--num-requests 20N`` in AIConfigurator's recipe (serving/README.md): 20 rounds of N
requests are profiled; the first ``WARMUP`` of them weigh that share of the mean."""


def round_weights(concurrency: int, warmup: int, total: int) -> np.ndarray:
    """Per request of a replayed row (in request order), its weight in the predicted mean: the
    first ``warmup`` rounds weigh ``warmup / PROFILED_ROUNDS``, the rest share the remainder."""
    first = min(warmup * concurrency, total)
    weights = np.empty(total)
    later = total - first
    burst_share = warmup / PROFILED_ROUNDS if later else 1.0
    weights[:first] = burst_share / max(first, 1)
    weights[first:] = (1 - burst_share) / max(later, 1)
    return weights
FIT_PARAMS = ("fixed_s", "per_seq_s")
FIT_METRICS = ("tpot",)
"""The CPU work per step sets the step time, which TPOT measures directly; a closed loop's TTFT
is mostly queueing and prefill, set by the scheduler (and by engine flags the file does not
record), so TTFT validates the fit instead of steering it, except for the one thing only TTFT
shows: the front end's latency per request, fitted after the CPU work to the TTFT of the rows at
low concurrency (:func:`~servesim.calibration.engine_fit.fit_front_end`)."""


@dataclass(frozen=True)
class TracedRow:
    row: ServingRow
    trace: ScheduleTrace | None
    problem: str | None
    simulated: bool = False
    """A deployment of several scheduling units: predicted by simulating it, not by re-timing."""

    def measurement(self, warmup: int) -> Measurement:
        assert self.trace is not None
        total = self.trace.done.size
        return Measurement(self.trace, np.arange(total), np.array([self.row.ttft_s]),
                           np.array([self.row.tpot_s]), group=self.row.model,
                           weights=round_weights(self.row.concurrency, warmup, total),
                           concurrency=self.row.concurrency)


def replayable(row: ServingRow) -> bool:
    """One scheduling unit per replica (no disaggregation, attention DP or pipeline) decoding
    one token per step (a speculating row's steps carry proposer passes that re-timing does not
    rescale), whose schedule can be traced once and re-timed."""
    return row.prefill is None and row.dp == 1 and row.pp == 1 and row.speculative is None


def _trace(args: tuple[ServingRow, int]) -> TracedRow:
    row, per_client = args
    document = row.document(per_client, {**ZERO_CPU, "frontend_latency_s": TRACE_FRONTEND_S})
    try:
        if not replayable(row):
            prepare(validate_document(document))  # every check, without running it
            return TracedRow(row, None, None, simulated=True)
        result = simulate_document(document)
    except ServesimError as exc:
        return TracedRow(row, None, f"the simulator refuses the deployment: {exc}")
    return TracedRow(row, trace_run(result), None)


def _simulate(args: tuple[ServingRow, int, int, Coefficients]) -> tuple[int, float, float]:
    """(row, mean TTFT, mean TPOT) of the measured requests of one simulated row."""
    row, warmup, measured, c = args
    if c.frontend_chunk_s and not replayable(row):  # the core streams from one unit per replica only
        c = replace(c, frontend_chunk_s=0.0)
    return (row.row, *replayed_means(row.document(warmup + measured, c.knobs()), row.concurrency, warmup))


def replayed_means(document: dict, concurrency: int, warmup: int) -> tuple[float, float]:
    """(mean TTFT, mean TPOT) of a closed-loop replay ``document`` of ``concurrency`` clients,
    the first ``warmup`` rounds weighed as :func:`round_weights` says."""
    requests = simulate_document(document).requests
    completed = (requests["status"] == "completed").to_numpy()
    weights = round_weights(concurrency, warmup, len(requests))
    ttft = np.where(completed, (requests["first_token_s"] - requests["arrival_s"]).to_numpy(float), np.nan)
    outputs = requests["output_tokens"].to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        decoding = (requests["finish_s"] - requests["first_token_s"]).to_numpy(float)
        tpot = np.where(completed & (outputs > 1), decoding / (outputs - 1), np.nan)
    return weighted_mean(ttft, weights), weighted_mean(tpot, weights)


def _run_simulations(jobs: list[tuple[ServingRow, int, int, Coefficients]],
                     workers: int) -> list[tuple[int, float, float]]:
    """:func:`_simulate` of every job, in order (``workers`` processes)."""
    return replay_map(_simulate, jobs, workers, "simulating rows")


def needs_simulation(t: TracedRow, c: Coefficients) -> bool:
    """A row predicted by simulating it: several scheduling units, or a trace that re-timing with
    ``c`` would not reproduce (a front end slower than some request's wait for its step:
    :func:`~servesim.calibration.replay.retimes_exactly`)."""
    return t.simulated or (t.trace is not None and not retimes_exactly(t.trace, c))


def simulate_rows(traced: list[TracedRow], coefficients: dict[int, Coefficients], warmup: int,
                  measured: int, workers: int = 1) -> dict[int, tuple[float, float]]:
    """Mean TTFT and TPOT of every row that must be simulated under its coefficients
    (:func:`needs_simulation`; ``workers`` processes)."""
    jobs = [(t.row, warmup, measured, coefficients[t.row.row]) for t in traced
            if t.row.row in coefficients and needs_simulation(t, coefficients[t.row.row])]
    return {row: (ttft, tpot) for row, ttft, tpot in _run_simulations(jobs, workers)}


FRONT_END_GRID_S = (TRACE_FRONTEND_S, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06,
                    0.08, 0.1, 0.125, 0.15)
"""The front-end latencies a serving fit tries (seconds). The lowest is the latency the rows are
traced with (10 us), not 0: re-timing a trace at a smaller latency keeps the traced batches, while
an engine run with none at all lets each request join the step that starts as it is sent, another
schedule (vLLM's rows: median TTFT error 22.4% at 10 us, 39.7% at 0 on 80 sampled rows)."""


def grid_predictions(rows: list[TracedRow], variants: list[Coefficients], warmup: int, measured: int,
                     workers: int = 1) -> dict[int, np.ndarray]:
    """Per re-timed row of ``rows``: its predicted (TTFT, TPOT) under each coefficient set of
    ``variants`` (shape ``(len(variants), 2)``), re-timed where that is exact and simulated where
    it is not (:func:`needs_simulation`); the simulations run in ``workers`` processes."""
    traced = [t for t in rows if t.trace is not None]
    curves = {t.row.row: np.full((len(variants), 2), np.nan) for t in traced}
    jobs, where = [], []
    for t in traced:
        for k, c in enumerate(variants):
            if needs_simulation(t, c):
                jobs.append((t.row, warmup, measured, c))
                where.append((t.row.row, k))
            else:
                ttft, tpot = t.measurement(warmup).predicted(c)
                curves[t.row.row][k] = (float(ttft[0]), float(tpot[0]))
    for (row, k), (_, ttft_s, tpot_s) in zip(where, _run_simulations(jobs, workers), strict=True):
        curves[row][k] = (ttft_s, tpot_s)
    return curves


def front_end_curves(traced: list[TracedRow], cpu: Coefficients, warmup: int, measured: int,
                     workers: int = 1) -> dict[int, np.ndarray]:
    """Per row (re-timed ones at <= ``FRONT_END_MAX_CONCURRENCY`` clients): its predicted mean
    TTFT at each latency of :data:`FRONT_END_GRID_S` with the CPU coefficients ``cpu``, re-timed
    where that is exact and simulated where it is not (a request that would join a busy
    replica's next step sooner than the latency may miss it, and the batches change: in
    TensorRT-LLM's drifting closed loops a 10 ms front end adds far more than 10 ms)."""
    light = [t for t in traced if t.row.concurrency <= FRONT_END_MAX_CONCURRENCY]
    variants = [replace(cpu, frontend_s=latency) for latency in FRONT_END_GRID_S]
    return {row: curve[:, 0] for row, curve in grid_predictions(light, variants, warmup, measured,
                                                                 workers).items()}


def pick_front_end(curves: dict[int, np.ndarray], rows: list[ServingRow]) -> float:
    """The latency whose predicted TTFT is closest to the measured one over ``rows`` (mean |log
    error|): the best of :data:`FRONT_END_GRID_S`, then refined between its neighbours on each
    row's TTFT interpolated linearly between the grid's latencies."""
    chosen = [(curves[r.row], r.ttft_s) for r in rows if r.row in curves]
    if not chosen:
        return TRACE_FRONTEND_S
    predicted = np.array([c for c, _ in chosen])
    measured = np.array([m for _, m in chosen])[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        errors = np.abs(np.log(predicted / measured))
    losses = np.nanmean(np.where(np.isfinite(errors), errors, np.nan), axis=0)
    best = int(np.nanargmin(losses))
    grid = np.asarray(FRONT_END_GRID_S)
    fine = np.linspace(grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)], 81)
    between = np.array([np.interp(fine, grid, curve) for curve in predicted])
    with np.errstate(invalid="ignore", divide="ignore"):
        fine_errors = np.abs(np.log(between / measured))
    fine_losses = np.nanmean(np.where(np.isfinite(fine_errors), fine_errors, np.nan), axis=0)
    return float(fine[int(np.nanargmin(fine_losses))])


STREAM_GRID_S = (0.0, 1e-5, 2e-5, 3e-5, 4.5e-5, 6e-5, 8e-5, 1.1e-4, 1.5e-4)
"""The front end's times per streamed chunk a serving fit tries (seconds): 0 (it keeps up with any
rate) to 150 us (under 7,000 chunks a second, below the slowest plateau in the serving file)."""


def stream_curves(traced: list[TracedRow], cpu: Coefficients, warmup: int, measured: int,
                  workers: int = 1) -> dict[int, np.ndarray]:
    """Per re-timed row: its predicted (TTFT, TPOT) at each time per chunk of
    :data:`STREAM_GRID_S` with the other coefficients ``cpu`` (shape ``(len(grid), 2)``); every
    non-zero value simulated (a streaming cost moves the clients' sends, which a trace does not
    hold: :func:`~servesim.calibration.replay.retimes_exactly`)."""
    variants = [replace(cpu, frontend_chunk_s=chunk) for chunk in STREAM_GRID_S]
    return grid_predictions(traced, variants, warmup, measured, workers)


STREAM_EVIDENCE_Z = 2.5
"""How many standard errors a time per chunk must beat 0 by (mean per-row loss) to be chosen at all:
z for 5% one-sided, shared among the grid's eight non-zero values (Bonferroni)."""


def pick_stream(curves: dict[int, np.ndarray], rows: list[ServingRow]) -> float:
    """The time per chunk (of :data:`STREAM_GRID_S`) that predicts ``rows`` best. Each row's loss
    is the |log error| of its TTFT plus that of its TPOT (a front end that cannot keep up delays
    first tokens and shrinks the engine's batch, so both move). Most rows never saturate a front
    end, so their loss is flat in it and noise alone would pick some value: 0 (a front end that
    keeps up) stays unless the value of least mean loss beats it by more than
    :data:`STREAM_EVIDENCE_Z` standard errors of the per-row differences; then the smallest value
    within one standard error of that best is chosen (the one-standard-error rule)."""
    chosen = [(curves[r.row], (r.ttft_s, r.tpot_s)) for r in rows if r.row in curves]
    if not chosen:
        return 0.0
    predicted = np.array([c for c, _ in chosen])  # rows x grid x 2
    measured = np.array([m for _, m in chosen])[:, None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        losses = np.abs(np.log(predicted / measured)).sum(axis=2)  # rows x grid
    losses = losses[np.all(np.isfinite(losses), axis=1)]  # rows every grid value predicts
    if len(losses) < 2:
        return 0.0
    best = int(np.argmin(losses.mean(axis=0)))
    worse = losses - losses[:, [best]]  # per row, each value's loss beyond the best's
    error = worse.std(axis=0, ddof=1) / np.sqrt(len(losses))
    if worse[:, 0].mean() <= STREAM_EVIDENCE_Z * error[0]:
        return 0.0
    within = np.flatnonzero(worse.mean(axis=0) <= error)
    return float(STREAM_GRID_S[int(within[0])])


HANDOFF_GRID_S = tuple(i * 0.01 for i in range(31))
"""Hand-off latencies tried (0-300 ms)."""
HANDOFF_MAX_CONCURRENCY = 16
"""The hand-off latency is fitted to disaggregated rows at up to this many clients, where the
prefill and decode workers are lightly loaded and the gap between measured and simulated TTFT is
the path's fixed part, not queueing."""


def is_disaggregated(t: TracedRow) -> bool:
    """A disaggregated row (simulated, never re-timed)."""
    return t.simulated and t.row.prefill is not None


def pick_handoff(ttft_without: dict[int, float], rows: list[ServingRow]) -> float:
    """The hand-off latency (of :data:`HANDOFF_GRID_S`) whose predicted TTFT is closest to the
    measured one over ``rows`` (mean |log error|), each row's TTFT taken as its simulated TTFT
    without a hand-off latency plus the latency: at few clients a fixed delay on every request's
    path adds to its TTFT as it is (the final predictions are simulated with the latency)."""
    chosen = [(ttft_without[r.row], r.ttft_s) for r in rows
              if r.row in ttft_without and np.isfinite(ttft_without[r.row])]
    if not chosen:
        return 0.0
    predicted = np.array([p for p, _ in chosen])[:, None] + np.asarray(HANDOFF_GRID_S)[None, :]
    measured = np.array([m for _, m in chosen])[:, None]
    losses = np.mean(np.abs(np.log(predicted / measured)), axis=0)
    return float(HANDOFF_GRID_S[int(np.argmin(losses))])


def fit_handoff(traced: list[TracedRow], lomo: dict[int, Coefficients], fitted: dict[str, Coefficients],
                warmup: int, measured: int, workers: int = 1) -> None:
    """Each engine's hand-off latency, fitted to its disaggregated rows at <=
    :data:`HANDOFF_MAX_CONCURRENCY` clients (simulated with the CPU coefficients already in
    ``lomo``, without a hand-off latency): ``fitted`` gets the one of all models' rows, each row in
    ``lomo`` the one of the other models' rows (leave one model out), in place."""
    light = [t for t in traced if is_disaggregated(t) and t.row.row in lomo
             and t.row.concurrency <= HANDOFF_MAX_CONCURRENCY]
    without = {t.row.row: replace(lomo[t.row.row], handoff_s=0.0) for t in light}
    ttft = {row: value for row, value, _ in _run_simulations(
        [(t.row, warmup, measured, without[t.row.row]) for t in light], workers)}
    for engine in fitted:
        mine = [t.row for t in light if t.row.engine == engine]
        if not mine:
            continue
        fitted[engine] = replace(fitted[engine], handoff_s=pick_handoff(ttft, mine))
        held_out: dict[str, float] = {}  # each model's latency, fitted on the other models' rows
        for t in traced:
            if t.row.engine == engine and is_disaggregated(t) and t.row.row in lomo:
                model = t.row.model
                if model not in held_out:
                    held_out[model] = pick_handoff(ttft, [r for r in mine if r.model != model])
                lomo[t.row.row] = replace(lomo[t.row.row], handoff_s=held_out[model])


def trace_rows(rows: Iterable[ServingRow], warmup: int = WARMUP, measured: int = MEASURED,
               workers: int = 1) -> list[TracedRow]:
    """Every row's schedule (in file order); ``workers`` processes."""
    return replay_map(_trace, [(row, warmup + measured) for row in rows], workers, "tracing rows")


def shipped_coefficients(engine: str, hardware: str) -> Coefficients:
    """The engine's CPU coefficients as ``servesim run`` would use them on ``hardware``."""
    cpu = make_engine(engine, {}).cpu(hardware)
    return Coefficients(cpu.fixed_s, cpu.per_seq_s, cpu.per_token_s, serial_fixed_s=cpu.serial_fixed_s,
                        serial_per_seq_s=cpu.serial_per_seq_s, frontend_s=cpu.frontend_s,
                        handoff_s=cpu.handoff_s, frontend_chunk_s=cpu.frontend_chunk_s)


def prediction_rows(traced: list[TracedRow], coefficients: dict[int, Coefficients], warmup: int,
                    label: str, simulated: dict[int, tuple[float, float]] | None = None) -> pd.DataFrame:
    """One line per replayed row: measured and predicted TTFT and TPOT, and their errors
    (``simulated``: the predictions of the rows that were simulated rather than re-timed)."""
    lines = []
    for t in traced:
        r = t.row
        if simulated is not None and r.row in simulated:
            predicted, replay = simulated[r.row], "simulated"
        elif t.trace is not None:
            ttft, tpot = t.measurement(warmup).predicted(coefficients[r.row])
            predicted, replay = (float(ttft[0]), float(tpot[0])), "re-timed"
        else:
            continue
        layout = (f"P{r.prefill[0]}x(tp{r.prefill[1]} dp{r.prefill[2]} ep{r.prefill[3]}) "
                  f"D{r.decode[0]}x(tp{r.decode[1]} dp{r.decode[2]} ep{r.decode[3]})"
                  if r.prefill is not None and r.decode is not None
                  else f"tp{r.tp} pp{r.pp} dp{r.dp} ep{r.ep}")
        budget = r.step_budget()  # what the replay assumed
        lines.append({"row": r.row, "engine": r.engine, "version": r.version, "measured_on": r.measured_on,
                      "gpu": r.gpu, "model": r.hf_model, "tp": r.tp,
                      "layout": layout, "precision": r.precision,
                      "kv_cache": r.kv_cache(),
                      "step_budget": budget,
                      "isl": r.isl, "osl": r.osl,
                      "concurrency": r.concurrency,
                      "measured_ttft_ms": r.ttft_s * 1e3, "measured_tpot_ms": r.tpot_s * 1e3,
                      "predicted_ttft_ms": predicted[0] * 1e3, "predicted_tpot_ms": predicted[1] * 1e3,
                      "prediction": label, "replay": replay})
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
                    "within_tpot10_ttft20_%": 100 * within.mean(),
                    "simulated_rows": int((group["replay"] == "simulated").sum())})
    return pd.DataFrame(out)


CONCURRENCY_BANDS = (1, 9, 33, 129)
"""Lower edges of the client-concurrency bands :func:`by_concurrency` reports (1-8, 9-32, 33-128,
129 and more)."""


def by_concurrency(rows: pd.DataFrame) -> pd.DataFrame:
    """Per engine (and all together) and band of client concurrency: rows, the median ratio of
    predicted to measured TTFT and TPOT (1: unbiased; below 1: predicted too fast) and their median
    APE. The bias by band is what a per-engine median hides: a replay that is right at a few
    clients and short at many."""
    edges = [*CONCURRENCY_BANDS, np.inf]
    labels = [f"{lo}-{hi - 1:.0f}" if np.isfinite(hi) else f"{lo}+" for lo, hi in pairwise(edges)]
    band = pd.cut(rows["concurrency"], edges, right=False, labels=labels)
    out = []
    for engine, group in [("all", rows), *rows.groupby("engine")]:
        for label in labels:
            part = group[band.loc[group.index] == label]
            if part.empty:
                continue
            line: dict[str, Any] = {"engine": engine, "concurrency": label, "rows": len(part)}
            for metric in ("ttft", "tpot"):
                ratio = part[f"predicted_{metric}_ms"] / part[f"measured_{metric}_ms"]
                line[f"{metric}_median_ratio"] = float(ratio.median())
                line[f"{metric}_median_ape_%"] = float(part[f"{metric}_ape_%"].median())
            out.append(line)
    return pd.DataFrame(out)


def skipped_table(data: ServingFile, traced: list[TracedRow]) -> pd.DataFrame:
    refused = pd.DataFrame([{"row": t.row.row, "backend": t.row.engine, "model": t.row.hf_model,
                             "system": t.row.gpu, "reason": t.problem}
                            for t in traced if t.problem is not None],
                           columns=["row", "backend", "model", "system", "reason"])
    return pd.concat([data.skipped, refused], ignore_index=True).sort_values("row")


def _hover(r: Any, engine: str) -> str:
    """One row's label in the chart: the deployment, and the release and day it was measured."""
    day = f", {r.measured_on}" if isinstance(r.measured_on, str) and r.measured_on else ""
    return (f"row {r.row}: {r.model} {r.gpu} tp{r.tp} {r.isl}/{r.osl} c{r.concurrency}"
            f" ({engine} {r.version or '?'}{day})")


def chart(rows: pd.DataFrame, title: str, path: Path) -> None:
    """Predicted vs measured TTFT and TPOT (log-log, top) and their ratio against the client
    concurrency (bottom: the bias :func:`by_concurrency` tabulates), coloured by engine."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "TTFT (ms)", "TPOT (ms)", "TTFT predicted / measured by clients",
        "TPOT predicted / measured by clients"))
    colours = {"vllm": "#1f77b4", "sglang": "#d62728", "trtllm": "#2ca02c"}
    for col, metric in ((1, "ttft"), (2, "tpot")):
        measured, predicted = f"measured_{metric}_ms", f"predicted_{metric}_ms"
        for engine, group in rows.groupby("engine"):
            style = {"name": str(engine), "legendgroup": str(engine), "mode": "markers",
                     "marker": {"color": colours.get(str(engine), "gray"), "size": 6, "opacity": 0.7},
                     "text": [_hover(r, str(engine)) for r in group.itertuples()]}
            fig.add_trace(go.Scatter(x=group[measured], y=group[predicted], showlegend=col == 1, **style),
                          row=1, col=col)
            fig.add_trace(go.Scatter(x=group["concurrency"], y=group[predicted] / group[measured],
                                     showlegend=False, **style), row=2, col=col)
        values = rows[[measured, predicted]].to_numpy()
        lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", showlegend=False,
                                 line={"dash": "dash", "color": "gray"}), row=1, col=col)
        clients = rows["concurrency"].to_numpy(float)
        fig.add_trace(go.Scatter(x=[clients.min(), clients.max()], y=[1.0, 1.0], mode="lines",
                                 showlegend=False, line={"dash": "dash", "color": "gray"}), row=2, col=col)
        fig.update_xaxes(type="log", title="measured", row=1, col=col)
        fig.update_yaxes(type="log", title="predicted", row=1, col=col)
        fig.update_xaxes(type="log", title="client concurrency", row=2, col=col)
        fig.update_yaxes(type="log", title="predicted / measured", row=2, col=col)
    fig.update_layout(title=title, template="plotly_white", height=900)
    atomic_write_text(path, fig.to_html(include_plotlyjs=True, full_html=True))


def write_outputs(out: Path, rows: pd.DataFrame, summary: pd.DataFrame, skipped: pd.DataFrame,
                  title: str, noise: pd.DataFrame | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "serving_rows.csv", rows.to_csv(index=False))
    atomic_write_text(out / "serving_summary.csv", summary.to_csv(index=False))
    atomic_write_text(out / "serving_by_concurrency.csv", by_concurrency(rows).to_csv(index=False))
    atomic_write_text(out / "serving_skipped.csv", skipped.to_csv(index=False))
    if noise is not None:
        atomic_write_text(out / "serving_noise.csv", noise.to_csv(index=False))
    if len(rows):
        chart(rows, title, out / "serving.html")


def read_with_spread(path: Path, length_spread: float) -> ServingFile:
    """The serving file, its rows replayed with output lengths spread by ``length_spread``
    (:attr:`ServingRow.length_spread`)."""
    data = read_serving_file(path)
    if length_spread:
        data.rows = [replace(r, length_spread=length_spread) for r in data.rows]
    return data


def validate_serving(path: Path, out: Path | None = None, workers: int = 1, warmup: int = WARMUP,
                     measured: int = MEASURED, length_spread: float = 0.0,
                     ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Predicted vs measured for every expressible row of ``path``, with the engines as shipped:
    (rows, summary, skipped rows with reasons, and how well the replayed rows' re-measurements
    predict each other: :func:`~servesim.calibration.serving_noise.replayed_noise`)."""
    data = read_with_spread(path, length_spread)
    traced = trace_rows(data.rows, warmup, measured, workers)
    coefficients = {t.row.row: shipped_coefficients(t.row.engine, HARDWARE[t.row.gpu]) for t in traced}
    simulated = simulate_rows(traced, coefficients, warmup, measured, workers)
    rows = prediction_rows(traced, coefficients, warmup, "shipped", simulated)
    unique = data.total - data.duplicates
    summary = summarise(rows, unique)
    skipped = skipped_table(data, traced)
    noise = replayed_noise(data.unique, rows)
    if out is not None:
        write_outputs(Path(out), rows, summary, skipped, f"{Path(path).name}: servesim vs measured", noise)
    return rows, summary, skipped, noise


@dataclass
class ServingFit:
    """Per engine: coefficients fitted on all rows, and the leave-one-model-out predictions."""

    coefficients: dict[str, Coefficients]
    lomo_rows: pd.DataFrame
    lomo_summary: pd.DataFrame
    skipped: pd.DataFrame
    rows_used: dict[str, int]
    length_spread: float = 0.0
    """The output-length spread the rows were replayed with (:attr:`ServingRow.length_spread`),
    read from the traced rows, so every caller of :func:`fit_traced` gets it in the provenance."""
    noise: pd.DataFrame = field(default_factory=pd.DataFrame)
    """How well the predicted rows' re-measurements predict each other
    (:func:`~servesim.calibration.serving_noise.replayed_noise`): the floor under ``lomo_summary``."""


def fit_serving(path: Path, workers: int = 1, warmup: int = WARMUP, measured: int = MEASURED,
                engines: tuple[str, ...] = ("vllm", "sglang", "trtllm"),
                params: tuple[str, ...] = FIT_PARAMS, metrics: tuple[str, ...] = FIT_METRICS,
                front_end: bool = True, length_spread: float = 0.0, stream: bool = False) -> ServingFit:
    """Each engine's CPU coefficients (and front-end latency, and with ``stream`` its time per
    streamed chunk) fitted to its rows of ``path``, and the leave-one-model-out error of that fit."""
    data = read_with_spread(path, length_spread)
    traced = trace_rows([r for r in data.rows if r.engine in engines], warmup, measured, workers)
    return fit_traced(data, traced, workers, warmup, measured, engines, params, metrics,
                      front_end=front_end, stream=stream)


def fit_traced(data: ServingFile, traced: list[TracedRow], workers: int = 1, warmup: int = WARMUP,
               measured: int = MEASURED, engines: tuple[str, ...] = ("vllm", "sglang", "trtllm"),
               params: tuple[str, ...] = FIT_PARAMS, metrics: tuple[str, ...] = FIT_METRICS,
               simulate: bool = True, front_end: bool = True, handoff: bool = True,
               stream: bool = False) -> ServingFit:
    """:func:`fit_serving` on rows already traced (``simulate`` False: leave the simulated rows'
    predictions out, to compare fits quickly; ``front_end`` False: no front-end latency;
    ``handoff`` False: no disaggregated hand-off latency, :func:`fit_handoff`; ``stream``: also
    the front end's time per streamed chunk, :func:`pick_stream`)."""
    fitted: dict[str, Coefficients] = {}
    lomo: dict[int, Coefficients] = {}
    used: dict[str, int] = {}
    for engine in engines:
        mine = [t for t in traced if t.row.engine == engine and t.trace is not None]
        used[engine] = len(mine)
        if not mine:
            continue
        measurements = [t.measurement(warmup) for t in mine]
        fitted[engine] = fit(measurements, params, metrics=metrics)
        per_model = leave_one_model_out(measurements, params, metrics)
        if front_end:
            # the latency moves the schedule where requests join a busy replica: fitted to what
            # simulation says there (front_end_curves), not to the re-timed approximation; the
            # curves are priced with the CPU coefficients of all models (held-out models' TPOT
            # included), the latency of each held-out model chosen on the others' rows alone
            curves = front_end_curves(mine, fitted[engine], warmup, measured, workers)
            fitted[engine] = replace(fitted[engine], frontend_s=pick_front_end(curves, [t.row for t in mine]))
            per_model = {model: replace(c, frontend_s=pick_front_end(
                curves, [t.row for t in mine if t.row.model != model])) for model, c in per_model.items()}
        if stream:
            # fitted last, on every re-timed row of the engine (it only shows where the front end
            # saturates: fast engines at many clients), each held-out model's on the others' rows
            chunks = stream_curves(mine, fitted[engine], warmup, measured, workers)
            rows_of = [t.row for t in mine]
            fitted[engine] = replace(fitted[engine], frontend_chunk_s=pick_stream(chunks, rows_of))
            per_model = {model: replace(c, frontend_chunk_s=pick_stream(
                chunks, [r for r in rows_of if r.model != model])) for model, c in per_model.items()}
        for t in traced:
            if t.row.engine == engine and (t.trace is not None or t.simulated):
                # a model with no re-timed rows is predicted from all of them (none are its own)
                lomo[t.row.row] = per_model.get(t.row.model, fitted[engine])
    if simulate and handoff:
        fit_handoff(traced, lomo, fitted, warmup, measured, workers)
    # without ``simulate``, re-timed approximations stand in for what would be simulated
    simulated: dict[int, tuple[float, float]] | None = (
        simulate_rows([t for t in traced if t.row.row in lomo], lomo, warmup, measured, workers)
        if simulate else None)
    rows = prediction_rows([t for t in traced if t.row.row in lomo], lomo, warmup, "leave-one-model-out",
                           simulated)
    return ServingFit(fitted, rows, summarise(rows, data.total - data.duplicates),
                      skipped_table(data, traced), used,
                      length_spread=max((t.row.length_spread for t in traced), default=0.0),
                      noise=replayed_noise(data.unique, rows))


def runtime_profile_yaml(engine: str, c: Coefficients, provenance: str) -> str:
    """An engine runtime profile (``configs/engines/<engine>.yaml`` or ``engine.profile``)."""
    import yaml

    entry: dict[str, object] = {"fixed_s": float(f"{c.fixed_s:.4g}"),
                                "per_seq_s": float(f"{c.per_seq_s:.4g}"),
                                "per_token_s": float(f"{c.per_token_s:.4g}"), "per_sample_s": 0.0}
    if c.serial_fixed_s or c.serial_per_seq_s:
        entry.update(serial_fixed_s=float(f"{c.serial_fixed_s:.4g}"),
                     serial_per_seq_s=float(f"{c.serial_per_seq_s:.4g}"))
    if c.frontend_s:
        entry["frontend_s"] = float(f"{c.frontend_s:.4g}")
    if c.handoff_s:
        entry["handoff_s"] = float(f"{c.handoff_s:.4g}")
    if c.frontend_chunk_s:
        entry["frontend_chunk_s"] = float(f"{c.frontend_chunk_s:.4g}")
    entry["provenance"] = provenance
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
        serial = ("the serial part the GPU waits for also fitted, >= 0, at most 5 ms + 100 us per sequence"
                  if c.serial_fixed_s or c.serial_per_seq_s else "no serial part (not fitted)")
        front = (f"; the front end's latency per request fitted after them to the mean TTFT of the rows at "
                 f"<= {FRONT_END_MAX_CONCURRENCY} clients ({c.frontend_s * 1e3:.2f} ms, >= 10 us, a fixed "
                 f"time per request outside the steps)")
        if c.handoff_s:
            front += (f"; the disaggregated hand-off latency per request fitted last to the mean TTFT "
                      f"of its disaggregated rows at <= {HANDOFF_MAX_CONCURRENCY} clients "
                      f"({c.handoff_s * 1e3:.0f} ms, 0-300 ms grid)")
        spread = (f"; each row replayed with output lengths uniform within +/-{result.length_spread:.1%} of "
                  f"its OSL (--length-spread)" if result.length_spread else "")
        provenance = (f"fitted {date} by servesim calibrate fit-serving to the mean TPOT of "
                      f"{result.rows_used[engine]} measured closed-loop deployments of {source} "
                      f"(single-group rows deployed with the flags of AIConfigurator's generator rules, "
                      f"calibration/aic_flags.py, and the row's engine release, re-timed; host time per "
                      f"step and per scheduled sequence, >= 0, overlapping the GPU where that release "
                      f"schedules asynchronously and serial where it does not (vLLM before 0.14); "
                      f"{serial}; with the kernels fixed, it also "
                      f"absorbs what the kernels' prices miss end to end, so it is an effective cost)"
                      f"{front}{spread}; leave-one-model-out median APE by GPU: {errors or 'n/a'}")
        path = Path(out_dir) / f"{engine}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, runtime_profile_yaml(engine, c, provenance))
        written.append(path)
    return written
