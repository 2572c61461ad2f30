"""Does one deployment meet the SLOs at one arrival rate? Simulate it and judge.

**Workload at a rate.** Each replication ``k`` builds the workload once, with seed
``seed + k`` and ``requests_per_run`` requests, and every rate replays that same table with its
arrival times scaled by ``base_rate / rate`` (a trace's own mean rate, or the generator's). For
Poisson, gamma and constant arrivals that is exactly the process at the new rate (NumPy draws
an exponential or gamma gap as a standard draw times its scale), and it makes every rate see the
same requests in the same order (common random numbers), so the pass/fail verdict moves
monotonically with the rate instead of jumping with sampling noise. A trace replays the same
requests at every seed, so it runs one replication.

**Measurement.** The first ``warmup_fraction`` of requests (by arrival) start an empty system
and are left out; the rest are judged, including those that arrive last and drain the queue. A
request that is rejected or never finishes counts as an infinite TTFT, TPOT and E2E, so it can
only make a verdict worse. With percentile targets, the metric of a replication is the
``percentile``-th value (NumPy's linear interpolation, as vLLM's benchmark) of its judged
requests; with ``attainment``, it is the fraction of judged requests that complete within every
limit (one-token outputs have no TPOT to miss). A rate passes when the **mean over
replications** of each metric meets its target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servesim.capacity.config import CapacityConfig
from servesim.config import ExperimentConfig
from servesim.core.state import DONE, RequestState
from servesim.cost import BOUNDS
from servesim.errors import ServesimError
from servesim.metrics.tables import request_latencies
from servesim.pipeline import prepare, simulate
from servesim.topology.base import Topology
from servesim.workloads import build_workload
from servesim.workloads.requests import RequestTable

if TYPE_CHECKING:
    from servesim.pipeline.result import RunResult

METRICS = ("ttft_s", "tpot_s", "e2e_s")
_BIG = 1e300
"""Stands in for an infinite latency inside np.percentile (inf - inf would give NaN)."""


@dataclass(frozen=True)
class WorkloadSample:
    """The request tables of every replication at their base rate."""

    tables: tuple[RequestTable, ...]
    base_rate: float

    @property
    def mean_output_tokens(self) -> float:
        return float(np.mean(np.concatenate([t.output_tokens for t in self.tables])))

    @property
    def mean_prompt_tokens(self) -> float:
        return float(np.mean(np.concatenate([t.prompt_tokens for t in self.tables])))

    def decode_context(self) -> float:
        """Mean context of a decode step, over all output tokens: a request with prompt P and
        output O decodes O - 1 tokens over contexts P, P+1, ..., P+O-2."""
        prompt = np.concatenate([t.prompt_tokens for t in self.tables]).astype(float)
        output = np.concatenate([t.output_tokens for t in self.tables]).astype(float)
        decodes = output - 1
        if decodes.sum() <= 0:
            return float(prompt.mean())
        return float(np.sum(decodes * (prompt + (decodes - 1) / 2)) / decodes.sum())

    def at_rate(self, replication: int, rate: float) -> RequestTable:
        table = self.tables[replication]
        return replace(table, arrival_s=table.arrival_s * (self.base_rate / rate))


def sample_workload(config: CapacityConfig, base_dir: Path | None) -> WorkloadSample:
    workload = config.workload
    n = config.requests_per_run
    if workload.trace is None:
        assert workload.arrival is not None
        rate = workload.arrival.rate
        if rate is None or not np.isfinite(rate):
            raise ServesimError("workload.arrival", "the capacity search scales an open arrival "
                                "process's rate; closed-loop clients and rate inf have none",
                                "use process poisson, gamma or constant with a finite rate")
        sized = workload.model_copy(update={"num_requests": n, "duration_s": None})
        tables = tuple(build_workload(sized, config.seed + k, base_dir)
                       for k in range(config.search.replications))
        return WorkloadSample(tables, rate)
    table = build_workload(workload, config.seed, base_dir)
    if len(table) > n:
        table = table.take(np.arange(n))
    if table.mean_rate <= 0:
        raise ServesimError("workload.trace", "needs at least two requests at distinct times",
                            "widen the trace window")
    return WorkloadSample((table,), table.mean_rate)


@dataclass
class RunMetrics:
    """One replication at one rate."""

    percentiles: dict[str, float]
    attainment: float
    bound_seconds: dict[str, float]
    preemptions: int
    peak_kv: float
    mean_kv: float
    queue_growth_per_s: float
    mean_batch: float
    max_running: int
    rejected: int
    misses: dict[str, float]
    """Per limit: the fraction of judged requests over it (or not completed)."""


def run_once(experiment: ExperimentConfig, table: RequestTable, config: CapacityConfig,
             topology: Topology | None = None) -> RunMetrics:
    """One simulation of ``experiment`` on ``table``, measured; ``topology``: ``experiment``'s,
    already resolved (reused across the rates of a search)."""
    return measure(simulate(prepare(experiment, workload=table, topology=topology)), table, config)


def latency_values(r: RequestState) -> dict[str, np.ndarray]:
    """Each request's TTFT, TPOT and E2E as the verdict reads them: infinite for a request that
    did not complete, NaN TPOT for a completed one-token output."""
    done = r.status == DONE
    latency = request_latencies(r)
    values: dict[str, np.ndarray] = {}
    values["ttft_s"] = np.where(done, latency["ttft_s"], np.inf)
    values["e2e_s"] = np.where(done, latency["e2e_s"], np.inf)
    tpot = latency["tpot_s"]
    tpot[~done] = np.inf
    values["tpot_s"] = tpot
    return values


@dataclass
class LatencyMetrics:
    """What the verdict reads of one replication: its percentiles, attainment and misses."""

    percentiles: dict[str, float]
    attainment: float
    misses: dict[str, float]


def judged_mask(n: int, config: CapacityConfig) -> np.ndarray:
    """The requests the verdict reads: all but the first ``warmup_fraction`` (by arrival)."""
    return np.arange(n) >= math.floor(config.search.warmup_fraction * n)


def latency_metrics(values: dict[str, np.ndarray], done: np.ndarray, config: CapacityConfig
                    ) -> LatencyMetrics:
    """The percentiles, attainment and miss fractions of ``values`` (:func:`latency_values`, or
    the same for a fleet's replicas put together), over the judged requests."""
    judged = judged_mask(done.size, config)
    limits = config.slo.limits()
    percentiles = {key: _percentile(values[key][judged], config.slo.percentile) for key in METRICS}
    met = done[judged].copy()
    misses: dict[str, float] = {}
    for key, limit in limits.items():
        v = values[key][judged]
        within = (v <= limit) | np.isnan(v)
        misses[key] = float(np.mean(~within)) if v.size else 0.0
        met &= within
    return LatencyMetrics(percentiles, float(met.mean()) if met.size else 0.0, misses)


def measure(result: RunResult, table: RequestTable, config: CapacityConfig) -> RunMetrics:
    """One finished simulation of ``table``, measured (see the module docstring)."""
    r = result.request_state
    done = r.status == DONE
    latency = latency_metrics(latency_values(r), done, config)
    records = result.step_log.records()
    bound_seconds = {name: float(records["duration_s"][records["bound"] == i].sum())
                     for i, name in enumerate(BOUNDS)}
    topology = result.plan.topology
    blocks = topology.kv_group.limits.num_blocks
    kv_run = next(run for run in result.groups if run.group is topology.kv_group)
    peak = max(state.pool.peak_used for state in kv_run.states) / blocks
    queue_growth = _queue_growth(records, table)  # every group's queue
    if len(topology.groups) > 1:  # KV use and batch of the group where requests decode
        kv_replicas = np.arange(kv_run.first_index, kv_run.first_index + len(kv_run.replicas))
        records = records[np.isin(records["replica"], kv_replicas)]
    if records.size and records["duration_s"].sum() > 0:
        mean_kv = float(np.average(records["kv_blocks_used"] / blocks, weights=records["duration_s"]))
        mean_batch = float(np.average(records["num_prefills"] + records["num_decodes"],
                                      weights=records["duration_s"]))
    else:
        mean_kv = mean_batch = 0.0
    return RunMetrics(percentiles=latency.percentiles, attainment=latency.attainment,
                      bound_seconds=bound_seconds, preemptions=int(r.preemptions.sum()),
                      peak_kv=float(peak), mean_kv=mean_kv,
                      queue_growth_per_s=queue_growth,
                      mean_batch=mean_batch,
                      max_running=int(records["running"].max()) if records.size else 0,
                      rejected=int(np.count_nonzero(~done)), misses=latency.misses)


def _percentile(values: np.ndarray, q: float) -> float:
    finite_or_inf = values[~np.isnan(values)]
    if finite_or_inf.size == 0:
        return math.nan
    point = float(np.percentile(np.minimum(finite_or_inf, _BIG), q))
    return math.inf if point >= _BIG / 2 else point


def _queue_growth(records: np.ndarray, table: RequestTable) -> float:
    """Requests per second by which the waiting queue grows while requests arrive: the slope of
    a least-squares line through (step start, waiting requests), one point per step. Near 0 for
    a stable system; close to (offered - served) rate for an overloaded one."""
    if records.size < 3 or len(table) < 2:
        return 0.0
    during = records["start_s"] <= table.arrival_s[-1]
    t, waiting = records["start_s"][during], records["waiting"][during].astype(float)
    if t.size < 3 or np.ptp(t) == 0:
        return 0.0
    return float(np.polyfit(t, waiting, 1)[0])


def verdict(config: CapacityConfig, runs: list[LatencyMetrics] | list[RunMetrics], rate: float
            ) -> dict[str, Any]:
    """The verdict at ``rate``: the mean over replications of each metric, the margins against
    each target, and whether every margin is >= 0."""
    slo = config.slo
    limits = slo.limits()
    metrics = {key: float(np.mean([run.percentiles[key] for run in runs])) for key in METRICS}
    attainment = float(np.mean([run.attainment for run in runs]))
    margins: dict[str, float] = {}
    if slo.attainment is None:
        for key, limit in limits.items():
            value = metrics[key]
            margins[key] = 0.0 if math.isnan(value) else 1.0 - value / limit
    else:
        margins["attainment"] = attainment - slo.attainment
    return {
        "rate": rate,
        "passed": all(m >= 0 for m in margins.values()),
        "metrics": {f"p{slo.percentile:g}_{key}": value for key, value in metrics.items()},
        "attainment": attainment,
        "miss_fractions": {key: float(np.mean([run.misses[key] for run in runs])) for key in limits},
        "margins": margins,
    }


def judge(config: CapacityConfig, runs: list[RunMetrics], rate: float) -> dict[str, Any]:
    """:func:`verdict`, then what the steps say (bound shares, KV, queue, batch), as one record."""
    busy = {name: float(np.sum([run.bound_seconds[name] for run in runs])) for name in BOUNDS}
    total = sum(busy.values())
    return {
        **verdict(config, runs, rate),
        "bound_shares": {name: (s / total if total else 0.0) for name, s in busy.items()},
        "preemptions": float(np.mean([run.preemptions for run in runs])),
        "peak_kv_use": max(run.peak_kv for run in runs),
        "mean_kv_use": float(np.mean([run.mean_kv for run in runs])),
        "queue_growth_per_s": float(np.mean([run.queue_growth_per_s for run in runs])),
        "mean_batch": float(np.mean([run.mean_batch for run in runs])),
        "max_running": max(run.max_running for run in runs),
        "not_completed": float(np.mean([run.rejected for run in runs])),
        "replications": len(runs),
    }
