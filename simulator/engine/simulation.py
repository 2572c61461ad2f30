"""Build and run one simulation: arrivals -> router -> replicas, on one SimPy clock.

The arrival process walks the request table in order, one SimPy timeout per arrival, and hands
each request to the router; each replica runs its iteration loop (:mod:`servesim.engine.replica`).
The run ends when every request has completed or been rejected: the event queue then empties.
Nothing here is random: the workload's seed fixes the table, and the same table and config give
the same results, bit for bit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import simpy
from servesim.config import ExperimentConfig
from servesim.engine.deployment import Deployment, policy_knobs, resolve_deployment
from servesim.engine.prefix_index import PrefixIndex
from servesim.engine.replica import Replica
from servesim.engine.replica_state import ReplicaState
from servesim.engine.state import DONE, REJECTED, RequestState
from servesim.engine.step_log import StepLog
from servesim.policies.base import make_policy
from servesim.policies.routers import make_router
from servesim.workloads import build_workload
from servesim.workloads.requests import RequestTable

Progress = Callable[[int, int, float], None]
"""Called now and then with (requests finished or rejected, total requests, simulated time)."""


@dataclass
class SimulationResult:
    config: ExperimentConfig
    deployment: Deployment
    workload: RequestTable
    requests: RequestState
    steps: StepLog
    replica_states: list[ReplicaState]
    sim_time_s: float
    """When the last step ended."""
    wall_time_s: float
    base_dir: Path | None = None
    """The experiment file's folder, against which its relative paths resolve."""
    pools: list[str] | None = None
    """Disaggregated runs: each replica's pool ("prefill" or "decode"), by replica index."""
    link: Any = None
    """Disaggregated runs: the KV link (:class:`~servesim.engine.kv_link.KvLink`), for its stats."""


def simulate(config: ExperimentConfig, workload: RequestTable | None = None,
             base_dir: Path | None = None, progress: Progress | None = None) -> SimulationResult:
    """Run ``config`` (its workload, unless ``workload`` is given) to completion."""
    deployment = resolve_deployment(config)
    if workload is None:
        workload = build_workload(config.workload, config.seed, base_dir)
    if config.policy.name == "disaggregated":
        from servesim.engine.disaggregated import simulate_disaggregated

        return simulate_disaggregated(config, deployment, workload, base_dir, progress)  # type: ignore[arg-type]
    started = time.perf_counter()
    env = simpy.Environment()
    requests = RequestState(workload)
    steps = StepLog()
    limits = deployment.limits
    prefixes = PrefixIndex(workload, limits.block_size) if limits.enable_prefix_caching else None
    states = [ReplicaState(i, requests, limits, seed=config.seed, prefixes=prefixes)
              for i in range(deployment.replicas)]
    cost = deployment.cost_model()  # shared: its memo serves every replica
    replicas = [Replica(env, state, make_policy(config.policy.name, policy_knobs(config.policy), state),
                        cost, steps) for state in states]
    router = make_router(config.router.name, policy_knobs(config.router), states)
    env.process(_arrivals(env, workload, router.route, replicas))
    _run(env, requests, progress, every_s=max(1.0, workload.duration_s / 200))
    records = steps.records()
    end = float((records["start_s"] + records["duration_s"]).max()) if records.size else 0.0
    return SimulationResult(config, deployment, workload, requests, steps, states, end,
                            time.perf_counter() - started, base_dir)


def _arrivals(env: simpy.Environment, workload: RequestTable,
              route: Callable[[int, float], int], replicas: list[Replica]
              ) -> Generator[simpy.Event, object, None]:
    arrivals = workload.arrival_s.tolist()
    for request, at in enumerate(arrivals):
        if at > env.now:
            # now + (at - now) can round one ulp below ``at``; step up so that the clock never
            # runs before a trace's arrival time (else a queueing delay of -1e-17 s appears).
            delay = at - env.now
            if env.now + delay < at:
                delay = math.nextafter(delay, math.inf)
            yield env.timeout(delay)
        replicas[route(request, env.now)].accept(request)


def _run(env: simpy.Environment, requests: RequestState, progress: Progress | None,
         every_s: float) -> None:
    if progress is not None:
        env.process(_monitor(env, requests, progress, every_s))
    env.run()


def _monitor(env: simpy.Environment, requests: RequestState, progress: Progress,
             every_s: float) -> Generator[simpy.Event, object, None]:
    """Report progress every ``every_s`` simulated seconds; it only reads state, so it cannot
    change the results. It stops when every request is finished, or when nothing else is left to
    happen (its own tick was the last event)."""
    total = len(requests)
    while True:
        yield env.timeout(every_s)
        status = requests.status
        finished = int(np.count_nonzero((status == DONE) | (status == REJECTED)))
        progress(finished, total, env.now)
        if finished == total or env.peek() == float("inf"):
            return
