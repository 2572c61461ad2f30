"""A fleet behind a round-robin router, simulated as its replicas one by one.

The planner checks every candidate's fleet by simulating it whole at the target rate (or on the
GPU budget): ``sets x replicas`` replicas behind the router, ``requests_per_run x sets``
requests. Round robin sends request ``i`` (in arrival order) to replica ``i mod n`` whatever the
replicas' state, and colocated replicas share nothing that changes what they do (each has its
own queue, KV pool and policy; the cost model's memo is a pure function). So replica ``k`` serves
exactly requests ``k, k + n, k + 2n, ...`` as it would alone, at the same times, and each
request's latencies are the same floats (``tests/test_capacity_probe.py`` compares them, zero
tolerance). Simulated alone, each replica's decode runs are no longer cut by the other
replicas' arrivals (``servesim.core.fast_forward``), so the fleet costs a fraction of the time.

Only what the argument covers is split: a colocated topology, the ``round_robin`` router, one
scheduling unit per replica (no pipeline stages or data-parallel ranks, whose units the router
sees), no prefix caching (a shared index), no speculation (its draws hash the request's index),
no linked requests (a completion may release a request into any replica), no closed loop.
Anything else is simulated whole, as before.
"""

from __future__ import annotations

import numpy as np

from servesim.capacity.probe import Part, Replication
from servesim.config import ExperimentConfig
from servesim.pipeline import prepare
from servesim.pipeline.slices import SlicedSimulation
from servesim.topology.base import Topology
from servesim.topology.colocated import Colocated
from servesim.topology.resolve import resolve_topology
from servesim.workloads.requests import RequestTable


def splits_by_replica(experiment: ExperimentConfig, topology: Topology, table: RequestTable) -> bool:
    """Whether the fleet is exactly its replicas simulated apart (see the module docstring)."""
    if not isinstance(topology, Colocated) or topology.router.name != "round_robin":
        return False
    group = topology.group
    if group.replicas < 2 or group.runs_pipeline or group.limits.enable_prefix_caching:
        return False
    if group.speculation is not None or table.links is not None:
        return False
    arrival = experiment.workload.arrival
    return arrival is None or arrival.process != "closed"


def fleet_replication(experiment: ExperimentConfig, table: RequestTable) -> Replication:
    """The fleet on ``table`` as one replication: its replicas apart when that is exact, else whole."""
    topology = resolve_topology(experiment)
    if not splits_by_replica(experiment, topology, table):
        plan = prepare(experiment, workload=table, topology=topology)
        return Replication(table, [Part(SlicedSimulation(plan))])
    replicas = topology.kv_group.replicas
    deployment = experiment.deployment.model_copy(update={"replicas": 1})
    single = experiment.model_copy(update={"deployment": deployment})
    one = resolve_topology(single)
    parts = []
    for k in range(replicas):
        rows = np.arange(k, len(table), replicas)
        plan = prepare(single, workload=table.take(rows), topology=one)
        parts.append(Part(SlicedSimulation(plan), rows))
    return Replication(table, parts)
