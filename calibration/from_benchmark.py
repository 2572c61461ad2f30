"""``servesim calibrate from-benchmark``: calibrate against my own benchmark run.

The user gives the result file of a ``vllm bench serve`` or SGLang ``bench_serving`` run
(:mod:`servesim.calibration.benchmark_result`) and an experiment YAML describing the deployment
that served it (model, GPU, engine, parallelism, precision; its workload is ignored). The
simulator replays exactly those requests, sent as the tool sent them, and reports per metric
(TTFT and TPOT: mean, p50, p90, p99) how far it is off. It then fits the engine's CPU
coefficients (time per step, per scheduled sequence, per new token) and, if asked, one scale per
kernel class (GEMM, prefill attention, decode attention, elementwise, communication) to that run,
reports the error again, and writes an engine runtime profile (``engine: {name: ..., profile:
FILE}``) and, with scales, a hardware profile whose efficiencies carry them (``hardware: FILE``),
for ``run``, ``sweep`` and ``capacity``.

Closed-loop and all-at-once runs are fitted on one traced schedule (exact: their schedule does not
depend on step times). At a finite rate the schedule moves with the step times, so the fit
alternates with re-simulating (a few to ten runs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servesim.atomic_io import atomic_write_text
from servesim.calibration.benchmark_result import read_benchmark
from servesim.calibration.benchmark_run import BenchmarkRun
from servesim.calibration.engine_fit import Measurement, fit, fit_front_end, loss
from servesim.calibration.profiles import write_profile
from servesim.calibration.replay import KERNEL_CLASSES, ZERO_CPU, Coefficients, ScheduleTrace, trace_run
from servesim.calibration.serving_validate import runtime_profile_yaml
from servesim.config import ExperimentConfig, load_experiment, validate_document
from servesim.hardware import HardwareProfile, OperatorEfficiency
from servesim.hardware_io import hardware_from_dict
from servesim.pipeline import prepare, simulate
from servesim.workloads.arrivals import interarrival_gaps
from servesim.workloads.requests import RequestTable

CPU_PARAMS = ("fixed_s", "per_seq_s", "per_token_s")
OPEN_LOOP_ROUNDS = 10
OPEN_LOOP_TOLERANCE = 1e-6
"""Open loop: at most this many fit-and-re-simulate rounds, stopping once the simulation's mean
absolute log error of TTFT and TPOT is below the tolerance."""
PERCENTILES = (("mean", None), ("p50", 50), ("p90", 90), ("p99", 99))


@dataclass
class BenchmarkFit:
    run: BenchmarkRun
    engine: str
    before: Coefficients
    after: Coefficients
    metrics: pd.DataFrame
    """Per metric and statistic: measured, predicted before and after the fit, their errors."""
    requests: pd.DataFrame
    hardware: HardwareProfile
    scaled_hardware: HardwareProfile | None


def replay_document(config: ExperimentConfig, run: BenchmarkRun,
                    ) -> tuple[dict[str, Any], RequestTable, np.ndarray]:
    """The user's deployment with the benchmark's requests as its workload, and the order of the
    run's requests in that table (sorted by arrival)."""
    n = len(run)
    document = config.model_dump(mode="json", exclude_none=True)
    if run.max_concurrency is not None:
        arrival: dict[str, Any] = {"process": "closed", "concurrency": run.max_concurrency}
        arrivals = np.zeros(n)
    elif math.isinf(run.request_rate):
        arrival, arrivals = {"process": "poisson", "rate": "inf"}, np.zeros(n)
    else:
        arrival = {"process": "gamma", "rate": run.request_rate, "burstiness": run.burstiness}
        if run.start_s is not None:
            arrivals = np.asarray(run.start_s, dtype=float)
        else:
            rng = np.random.default_rng(config.seed)
            arrivals = np.cumsum(interarrival_gaps("gamma", run.request_rate, n, rng, run.burstiness))
    document["workload"] = {"arrival": arrival, "num_requests": n, "prompt": {"dist": "fixed", "value": 1},
                            "output": {"dist": "fixed", "value": 1}}
    document["output"] = "full"
    order = np.argsort(arrivals, kind="stable")
    table = RequestTable(arrivals[order], run.prompt_tokens[order], run.output_tokens[order],
                         source=f"benchmark {run.source}")
    return document, table, order


def _metric_table(ttft_s: np.ndarray, tpot_s: np.ndarray,
                  predicted: dict[str, tuple[np.ndarray, np.ndarray]]) -> pd.DataFrame:
    lines = []
    for metric, measured in (("ttft_ms", ttft_s), ("tpot_ms", tpot_s)):
        for stat, q in PERCENTILES:
            def value(a: np.ndarray, q: float | None = q) -> float:
                a = a[np.isfinite(a)]
                if not a.size:
                    return float("nan")
                return float(np.mean(a) if q is None else np.percentile(a, q)) * 1e3
            line: dict[str, Any] = {"metric": metric, "stat": stat, "measured": value(measured)}
            for label, (ttft, tpot) in predicted.items():
                line[label] = value(ttft if metric == "ttft_ms" else tpot)
                line[f"{label}_error_%"] = 100 * (line[label] / line["measured"] - 1)
            lines.append(line)
    return pd.DataFrame(lines)


def scaled_profile(hardware: HardwareProfile, scales: tuple[float, ...], note: str) -> HardwareProfile:
    """``hardware`` with each kernel class ``scale`` times slower (efficiencies divided by it,
    capped at 1; fixed costs multiplied); communication scales the link and collectives."""
    data = hardware.model_dump(mode="json", exclude_none=True)
    by_class = dict(zip(KERNEL_CLASSES, scales, strict=True))
    targets = {"gemm": ("gemm", "gemm_fp8", "gemm_fp4"), "attn_prefill": ("attention_prefill",),
               "attn_decode": ("attention_decode", "attention_decode_fp8"), "elementwise": ("elementwise",)}
    for name, keys in targets.items():
        factor = by_class[name]
        for key in keys:
            if key in data["efficiency"]:
                data["efficiency"][key] = _scale_efficiency(OperatorEfficiency.model_validate(
                    data["efficiency"][key]), factor).model_dump(mode="json")
    factor = by_class["communication"]
    data["interconnect"]["efficiency"] = min(1.0, data["interconnect"]["efficiency"] / factor)
    data["interconnect"]["latency_s"] *= factor
    for entry in (data.get("collectives") or {}).values():
        if isinstance(entry, dict):  # each implementation's fit (eager_call_s is a host cost)
            entry["efficiency"] = min(1.0, entry["efficiency"] / factor)
            for curve in (entry.get("efficiency_by_world") or {}).values():  # they replace it per group
                curve["y"] = [min(1.0, y / factor) for y in curve["y"]]
            entry["latency_s"] *= factor
            entry["latency_per_peer_s"] *= factor
    data["name"] = f"{hardware.name}-fitted"
    data["spec_only"] = False
    data["provenance"] = {**data.get("provenance", {}), "benchmark_scales": note}
    return hardware_from_dict(data, data["name"])


def _scale_efficiency(eff: OperatorEfficiency, factor: float) -> OperatorEfficiency:
    """``eff`` ``factor`` times slower: its curves divided (capped at 1), its fixed cost multiplied;
    everything else (a GEMM's shape factors, relative to its curve; the KV tile) kept."""
    def curve(c: Any) -> dict[str, Any]:
        return {"axis": c.axis, "x": list(c.x), "y": [min(1.0, y / factor) for y in c.y]}
    data = eff.model_dump(mode="json", exclude_none=True)
    data.update(compute=curve(eff.compute), memory=curve(eff.memory), fixed_s=eff.fixed_s * factor)
    return OperatorEfficiency.model_validate(data)


def from_benchmark(result_path: Path, config_path: Path, overrides: list[str] | None = None,
                   scale_classes: tuple[str, ...] = (), out: Path | None = None) -> BenchmarkFit:
    run = read_benchmark(result_path)
    config = load_experiment(config_path, overrides or [])
    document, table, order = replay_document(config, run)
    plan = prepare(validate_document(document), workload=table)
    group = plan.topology.kv_group
    engine = group.engine
    cpu = engine.cpu(group.hardware.name)
    before = Coefficients(cpu.fixed_s, cpu.per_seq_s, cpu.per_token_s, frontend_s=cpu.frontend_s)
    open_loop = run.max_concurrency is None and not math.isinf(run.request_rate)
    measured = np.arange(len(run))
    ttft_s, tpot_s = run.ttft_s[order], run.tpot_s[order]

    def trace_with(c: Coefficients, sends_fixed: bool = open_loop) -> ScheduleTrace:
        """The schedule to re-time: with no CPU work when it does not depend on the step times,
        else (``sends_fixed``) the run simulated with ``c``, its requests' sends held fixed."""
        cpu_knobs = ZERO_CPU if not sends_fixed else c.knobs()
        doc = {**document, "engine": {**document["engine"], **cpu_knobs}}
        result = simulate(prepare(validate_document(doc), workload=table))
        return trace_run(result, open_loop=sends_fixed, cpu=c if sends_fixed else None)

    trace = trace_with(before)
    measurement = Measurement(trace, measured, ttft_s, tpot_s)
    predicted_before = measurement.predicted(before)
    if open_loop:
        after, measurement = _fit_open_loop(lambda c: Measurement(trace_with(c), measured, ttft_s, tpot_s),
                                            before, measurement, scale_classes)
        after = fit_front_end([measurement], after)  # the rounds fit TPOT; TTFT shows the front end
    else:  # a closed loop's schedule is fixed: CPU work and front end fitted together
        after = fit([measurement], CPU_PARAMS, scale_classes, start=before)
        after = fit([measurement], (*CPU_PARAMS, "frontend_s"), scale_classes, start=after)
        if after.frontend_s > 0 and run.max_concurrency is not None:
            # Its clients' requests enter a front-end latency after they are sent, mid-step while
            # others run: the schedule depends on the step times after all. Refine as for an
            # open loop, from the fixed-schedule answer.
            after, measurement = _fit_open_loop(
                lambda c: Measurement(trace_with(c, sends_fixed=True), measured, ttft_s, tpot_s),
                after, Measurement(trace_with(after, sends_fixed=True), measured, ttft_s, tpot_s),
                scale_classes)
            after = fit_front_end([measurement], after)
    predicted_after = measurement.predicted(after)
    metrics = _metric_table(ttft_s, tpot_s, {"before": predicted_before, "after": predicted_after})
    requests = pd.DataFrame({"prompt_tokens": table.prompt_tokens, "output_tokens": table.output_tokens,
                             "measured_ttft_s": ttft_s, "measured_tpot_s": tpot_s,
                             "before_ttft_s": predicted_before[0], "before_tpot_s": predicted_before[1],
                             "after_ttft_s": predicted_after[0], "after_tpot_s": predicted_after[1]})
    scaled = None
    if scale_classes:
        note = (f"kernel classes scaled by servesim calibrate from-benchmark to {run.source}: "
                + ", ".join(f"{k} x{s:.3g}" for k, s in zip(KERNEL_CLASSES, after.scales, strict=True)))
        scaled = scaled_profile(group.hardware, after.scales, note)
    result = BenchmarkFit(run, engine.name, before, after, metrics, requests, group.hardware, scaled)
    if out is not None:
        write_outputs(result, Path(out))
    return result


def _fit_open_loop(measure: Callable[[Coefficients], Measurement], start: Coefficients,
                   measurement: Measurement, scale_classes: tuple[str, ...],
                   ) -> tuple[Coefficients, Measurement]:
    """The coefficients of an open-loop run: fit on a trace, re-simulate with the fit, repeat.

    With arrivals fixed in time, a schedule traced at other step times has other batches, and
    re-timing it slides requests' first steps before they were sent; so each round fits TPOT
    alone (step times over each request's own span), then the front end's latency to TTFT (it
    decides when each request enters), re-simulates, and keeps the round whose
    fresh simulation is closest to the run in TTFT and TPOT. The rounds converge because the
    batches follow the step times: at the answer the trace is the run itself and exact (tested:
    a serial vLLM's 1.5 ms + 40 us per sequence recovered to 1e-6 in six rounds)."""
    best, best_loss, best_measurement = start, loss([measurement], start), measurement
    current = start
    for _ in range(OPEN_LOOP_ROUNDS):
        current = fit([measurement], CPU_PARAMS, scale_classes, start=current, metrics=("tpot",))
        current = fit_front_end([measurement], current)  # when requests enter moves the schedule too
        measurement = measure(current)
        current_loss = loss([measurement], current)
        if current_loss < best_loss:
            best, best_loss, best_measurement = current, current_loss, measurement
        if current_loss < OPEN_LOOP_TOLERANCE:
            break
    return best, best_measurement


def write_outputs(result: BenchmarkFit, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "benchmark_metrics.csv", out / "benchmark_requests.csv",
               out / f"engine-{result.engine}.yaml"]
    atomic_write_text(written[0], result.metrics.to_csv(index=False))
    atomic_write_text(written[1], result.requests.to_csv(index=False))
    c = result.after
    provenance = (f"fitted by servesim calibrate from-benchmark to {result.run.source} ({result.run.tool}, "
                  f"{len(result.run)} requests)")
    text = runtime_profile_yaml(result.engine, c, provenance)
    atomic_write_text(written[2], text)
    if result.scaled_hardware is not None:
        path = out / f"hardware-{result.hardware.name}.yaml"
        write_profile(result.scaled_hardware, path,
                      "kernel classes scaled by servesim calibrate from-benchmark")
        written.append(path)
    return written


def describe(result: BenchmarkFit) -> str:
    c = result.after
    scales = ", ".join(f"{k} x{s:.3g}" for k, s in zip(KERNEL_CLASSES, c.scales, strict=True) if s != 1.0)
    return (f"{result.engine}: CPU {c.fixed_s * 1e6:.0f} us per step + {c.per_seq_s * 1e6:.2f} us per "
            f"sequence + {c.per_token_s * 1e9:.1f} ns per new token; front end {c.frontend_s * 1e3:.1f} ms "
            f"per request" + (f"; {scales}" if scales else ""))


