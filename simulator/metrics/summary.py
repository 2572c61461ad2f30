"""The run's summary, typed: what ``summary.json`` holds, and what reports, sweeps, the capacity
planner and notebooks read.

Latency statistics are over completed requests (see :mod:`servesim.metrics.tables` for the
definitions), ITL over every inter-token gap. Throughput divides by the span from the first
arrival to the last completion (or the last arrival, if later). ``unfinished`` counts requests
neither completed nor rejected when the run ended: always 0 for the built-in policies (a test
holds them to it), reported rather than hidden for new ones. With SLOs, attainment is the
fraction of *all* requests (rejected ones count as misses) that complete within every limit
given, and goodput is those requests per second (DistServe's definition).

:meth:`Summary.to_dict` is ``summary.json`` key for key (its order and names are stable);
:meth:`Summary.from_dict` reads one back, so a report built from files and one built from a run
in memory see the same object. After the stable keys come the same numbers under ``vllm bench
serve``'s flat names and units (:mod:`servesim.metrics.benchmark_names`), so one script reads a
simulated run and a real benchmark alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from servesim.core.state import UNFINISHED_NAME
from servesim.metrics.benchmark_names import DEFAULT_PERCENTILES, benchmark_names, is_benchmark_key
from servesim.metrics.columns import ColumnTable, Table, column, select
from servesim.metrics.stats import describe, describe_weighted

SUMMARY_LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queueing_s")


@dataclass(frozen=True)
class LatencyStats:
    """mean, p50, p90, p95, p99 and max in seconds (None when no request has the metric)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None


@dataclass(frozen=True)
class Throughput:
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float


@dataclass(frozen=True)
class KvUsage:
    blocks_total: int
    block_size: int
    peak_blocks_used: int
    blocks_in_use_at_end: int
    mean_utilization: float

    @property
    def peak_fraction(self) -> float:
        return self.peak_blocks_used / max(self.blocks_total, 1)


@dataclass(frozen=True)
class SwapUsage:
    swaps_out: int
    swaps_in: int
    bytes_out: float
    bytes_in: float
    transfer_s: float
    host_blocks_total: int
    host_blocks_in_use_at_end: int


@dataclass(frozen=True)
class BatchUsage:
    steps: int
    mean_size: float
    prefill_steps: int
    busy_s: float


@dataclass(frozen=True)
class PrefixCacheStats:
    """Hit rate = prompt tokens found cached at each request's first admission / prompt tokens of
    the admitted requests (vLLM's prefix-cache hit rate, in tokens)."""

    hit_rate: float
    cached_tokens: int
    prompt_tokens: int
    evicted_blocks: int
    cached_blocks_at_end: int
    workload_has_prefixes: bool


@dataclass(frozen=True)
class Summary:
    ttft_s: LatencyStats
    tpot_s: LatencyStats
    itl_s: LatencyStats
    e2e_s: LatencyStats
    queueing_s: LatencyStats
    throughput: Throughput
    completed: int
    rejected: int
    unfinished: int
    preemptions: int
    slo_attainment: float | None
    goodput_requests_per_s: float | None
    slos: dict[str, float] | None
    duration_s: float
    num_requests: int
    offered_rate: float
    deployment: dict[str, Any]
    """The deployment as resolved (the topology's description, with policy and router)."""
    kv: KvUsage
    swap: SwapUsage
    batch: BatchUsage
    sections: dict[str, Any]
    """The topology's own sections (``disaggregation``), between ``batch`` and ``prefix_cache``."""
    prefix_cache: PrefixCacheStats | None
    benchmark: dict[str, Any] = field(default_factory=dict)
    """vLLM's benchmark names and units (``mean_ttft_ms``, ``p99_tpot_ms``, ``request_throughput``,
    ...), written flat after the stable keys."""

    def latency(self, key: str) -> LatencyStats:
        """The statistics of ``ttft_s``, ``tpot_s``, ``itl_s``, ``e2e_s`` or ``queueing_s``."""
        if key not in SUMMARY_LATENCIES:
            raise KeyError(key)
        stats: LatencyStats = getattr(self, key)
        return stats

    def to_dict(self) -> dict[str, Any]:
        """``summary.json``: the stable keys, in their stable order."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("sections", "benchmark"):
                out.update(value)
            elif f.name in ("deployment", "slos"):
                out[f.name] = value
            else:
                out[f.name] = asdict(value) if value is not None and hasattr(value, "__dataclass_fields__") \
                    else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        """A summary read back from ``summary.json``."""
        known = {f.name for f in fields(cls)} - {"sections", "benchmark"}
        prefix = data.get("prefix_cache")
        return cls(
            **{key: LatencyStats(**data[key]) for key in SUMMARY_LATENCIES},
            throughput=Throughput(**data["throughput"]), completed=data["completed"],
            rejected=data["rejected"], unfinished=data.get("unfinished", 0), preemptions=data["preemptions"],
            slo_attainment=data.get("slo_attainment"),
            goodput_requests_per_s=data.get("goodput_requests_per_s"),
            slos=data.get("slos"), duration_s=data["duration_s"], num_requests=data["num_requests"],
            offered_rate=data["offered_rate"], deployment=data.get("deployment") or {},
            kv=KvUsage(**data["kv"]), swap=SwapUsage(**data["swap"]), batch=BatchUsage(**data["batch"]),
            sections={k: v for k, v in data.items() if k not in known and not is_benchmark_key(k)},
            prefix_cache=PrefixCacheStats(**prefix) if prefix else None,
            benchmark={k: v for k, v in data.items() if is_benchmark_key(k)})


def slo_met(requests: Table, limits: dict[str, float]) -> np.ndarray:
    """Per request: completed and within every limit (a one-token output has no TPOT to miss)."""
    met = column(requests, "status") == "completed"
    for key, limit in limits.items():
        values = column(requests, key)
        within = values <= limit
        if key == "tpot_s":
            within |= np.isnan(values)
        met &= within
    return met


def run_span(requests: Table) -> float:
    """Seconds from the first arrival to the last completion (or the last arrival, if later):
    what throughputs divide by."""
    completed = column(requests, "status") == "completed"
    arrival = column(requests, "arrival_s")
    start = float(arrival.min()) if len(requests) else 0.0
    last_arrival = float(arrival.max()) if len(requests) else 0.0
    end = max(float(column(requests, "finish_s")[completed].max()) if completed.any() else start,
              last_arrival)
    return max(end - start, 1e-12)


def summarise(requests: Table, itl: Table, *, slo_limits: dict[str, float],
              offered_rate: float, deployment: dict[str, Any], kv: dict[str, Any], swap: dict[str, Any],
              batch: dict[str, Any], sections: dict[str, Any],
              prefix_cache: dict[str, Any] | None, steps: Table | None = None,
              metric_percentiles: tuple[float, ...] = DEFAULT_PERCENTILES) -> Summary:
    """The summary of a run from its tables and the usage figures of its replicas (``steps`` and
    ``metric_percentiles`` feed the vLLM-named section). The tables are DataFrames or
    :class:`~servesim.metrics.columns.ColumnTable` alike (the same arrays, the same figures)."""
    status = column(requests, "status")
    completed = status == "completed"
    span = run_span(requests)
    latencies = [key for key in SUMMARY_LATENCIES if key != "itl_s"]
    # the columns read, not the whole table, and when every request completed not even those:
    # a long run's table is not copied (at a million requests the copy alone was 56 MiB)
    done = (requests if bool(completed.all())
            else select(requests, completed, [*latencies, "prompt_tokens", "output_tokens"]))
    stats = {key: describe(column(done, key)) for key in latencies}
    output = column(done, "output_tokens")
    stats["itl_s"] = describe_weighted(column(itl, "itl_s"), column(itl, "count"))
    if slo_limits:
        met = slo_met(requests, slo_limits)
        attainment: float | None = float(met.mean()) if len(requests) else None
        goodput: float | None = float(met.sum()) / span
    else:
        attainment = goodput = None
    return Summary(
        **{key: LatencyStats(**stats[key]) for key in SUMMARY_LATENCIES},
        throughput=Throughput(
            requests_per_s=len(done) / span,
            output_tokens_per_s=float(output.sum()) / span,
            total_tokens_per_s=float((column(done, "prompt_tokens") + output).sum()) / span),
        completed=int(completed.sum()),
        rejected=int((status == "rejected").sum()),
        unfinished=int((status == UNFINISHED_NAME).sum()),
        preemptions=int(column(requests, "preemptions").sum()),
        slo_attainment=attainment, goodput_requests_per_s=goodput, slos=slo_limits or None,
        duration_s=span, num_requests=len(requests), offered_rate=offered_rate, deployment=deployment,
        kv=KvUsage(**kv), swap=SwapUsage(**swap), batch=BatchUsage(**batch), sections=sections,
        prefix_cache=PrefixCacheStats(**prefix_cache) if prefix_cache else None,
        benchmark=benchmark_names(requests, itl, steps if steps is not None else ColumnTable({}), span,
                                  goodput, metric_percentiles))


def prefix_cache_stats(requests: Table, caches: list[Any], workload_has_prefixes: bool
                       ) -> dict[str, Any] | None:
    """The prefix cache's hit rate over the admitted requests (recomputes after a preemption are
    not counted again); None when a replica caches no prefixes."""
    if not caches or any(c is None for c in caches):
        return None
    admitted = ~np.isnan(column(requests, "first_scheduled_s"))
    prompt = int(column(requests, "prompt_tokens")[admitted].sum())
    cached = int(column(requests, "cached_tokens")[admitted].sum())
    return {"hit_rate": cached / prompt if prompt else 0.0, "cached_tokens": cached, "prompt_tokens": prompt,
            "evicted_blocks": sum(c.evicted_blocks for c in caches),
            "cached_blocks_at_end": sum(c.cached_blocks for c in caches),
            "workload_has_prefixes": workload_has_prefixes}
