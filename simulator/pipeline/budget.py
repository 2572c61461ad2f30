"""What a run will need, checked before it is built: memory for its requests and replicas.

A run's memory grows with its requests (:data:`~servesim.inputs.limits.BYTES_PER_REQUEST`) and
its replicas (every replica is built before the first event), so ten million replicas or a
hundred million requests are refused up front with the figure and the fix, instead of being
killed by the kernel (or swapping the machine to a halt) after minutes of work.
"""

from __future__ import annotations

from servesim.config import ExperimentConfig
from servesim.inputs.limits import BYTES_PER_REPLICA, BYTES_PER_REQUEST, check_memory
from servesim.topology.base import Topology


def expected_requests(config: ExperimentConfig) -> tuple[float, str] | None:
    """(requests the workload will hold, at most or in expectation; the key that sets it), or None
    when only reading the trace will tell (its reader checks its own size)."""
    workload = config.workload
    if workload.trace is not None:
        limit = workload.trace.max_requests
        return (float(limit), "workload.trace.max_requests") if limit is not None else None
    assert workload.arrival is not None
    counts = []
    if workload.num_requests is not None:
        counts.append((float(workload.num_requests), "workload.num_requests"))
    if workload.duration_s is not None and workload.arrival.rate is not None:
        counts.append((workload.arrival.rate * workload.duration_s, "workload.duration_s"))
    return min(counts) if counts else None


def check_run_size(config: ExperimentConfig, topology: Topology) -> None:
    """Refuse a run whose requests and replicas would not fit in this machine's memory."""
    replicas = sum(group.replicas for group in topology.groups)
    check_memory(replicas * BYTES_PER_REPLICA, "deployment.replicas", f"{replicas:,} replicas",
                 "use fewer replicas (servesim builds every one before the run)")
    expected = expected_requests(config)
    if expected is None:
        return
    count, key = expected
    per_request = BYTES_PER_REQUEST[config.output]
    shown = f"{count:,.0f}" if count < 1e15 else f"{count:.3g}"
    check_memory(count * per_request + replicas * BYTES_PER_REPLICA, key,
                 f"{shown} requests ({per_request / 1e3:g} KB each with output: {config.output})",
                 "simulate fewer requests (a shorter window gives the same steady-state figures), "
                 "or set output: summary")
