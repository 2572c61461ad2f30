"""The interface every deployment topology implements, and the registry of them.

A topology is resolved once per run from the experiment (:meth:`Topology.resolve`: its groups,
routers and links, every limit checked) and built onto a simulation (:meth:`Topology.build`:
replica loops on the clock, and where arrivals enter). What the metrics need from it is generic:
its groups (one ``kv`` figure from :attr:`Topology.kv_group`), per-request rejection codes, and
any summary section or request columns of its own (the disaggregated topology's link and
transfer times). The engine, the CLI and the metrics never test a topology's kind.

New topologies (pipeline-parallel groups, autoscaled groups, heterogeneous fleets) register here
with :func:`register_topology` and answer the same questions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from servesim.core.replica_state import ReplicaState
from servesim.core.stream_out import open_stream
from servesim.dtypes import Precision
from servesim.engines import Engine
from servesim.errors import ServesimError
from servesim.model_spec import ModelSpec
from servesim.policies.base import Policy
from servesim.topology.group import ReplicaGroup

if TYPE_CHECKING:
    import pandas as pd

    from servesim.config import ExperimentConfig
    from servesim.core.kv_link import KvLink
    from servesim.core.parallel_replica import ParallelReplica
    from servesim.core.replica import ServingUnit
    from servesim.core.sim import Entry, Sim


@dataclass
class GroupRun:
    """One replica group as built for a run: its scheduling units (indices ``first_index ...``):
    one :class:`Replica` per replica, or one :class:`RankHandle` per virtual engine and DP rank of
    pipelined replicas (``pipelines``)."""

    group: ReplicaGroup
    replicas: list[ServingUnit]
    first_index: int
    pipelines: list[ParallelReplica] = field(default_factory=list)

    @property
    def states(self) -> list[ReplicaState]:
        return [replica.state for replica in self.replicas]


@dataclass
class Built:
    """A topology on the clock: where arrivals enter, its groups' replicas, its links."""

    entry: Entry
    groups: list[GroupRun]
    links: list[KvLink] = field(default_factory=list)


class Topology(ABC):
    """A deployment: groups of replicas and how requests flow between them."""

    kind: ClassVar[str]
    supports_prefix_caching: ClassVar[bool] = True
    prefix_caching_note: ClassVar[str] = ""
    fast_forward: ClassVar[bool] = False
    """Nothing but arrivals reaches a replica from outside between its steps (no KV landing from a
    link, no replica coming or going), so its replicas may fast-forward runs of pure-decode steps
    (``servesim.core.fast_forward``). Off by default: a topology that says nothing runs step by
    step."""

    def __init__(self, groups: tuple[ReplicaGroup, ...]) -> None:
        self.groups = groups

    # ------------------------------------------------------------------ resolution
    @classmethod
    @abstractmethod
    def resolve(cls, config: ExperimentConfig, engine: Engine) -> Topology:
        """The topology of ``config``, every key checked (errors are one line naming the key)."""

    # ------------------------------------------------------------------ what it is
    @property
    def model(self) -> ModelSpec:
        return self.groups[0].model

    @property
    def precision(self) -> Precision:
        return self.groups[0].precision

    @property
    def engine(self) -> Engine:
        return self.groups[0].engine

    @property
    def num_gpus(self) -> int:
        return sum(group.num_gpus for group in self.groups)

    @property
    def replicas(self) -> int:
        return sum(group.replicas for group in self.groups)

    @property
    def kv_group(self) -> ReplicaGroup:
        """The group whose KV pool the summary's ``kv`` section reports (where requests decode)."""
        return self.groups[-1]

    def group_of_replica(self) -> list[str]:
        """Each replica index's group name (a replica index names one scheduling unit: a replica,
        or one virtual engine's DP rank of a pipelined replica)."""
        return [group.name for group in self.groups for _ in range(group.units)]

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The summary's ``deployment`` section (without policy and router, added by the caller)."""

    def describe_links(self) -> list[str]:
        """One line per link between groups, for people."""
        return []

    # ------------------------------------------------------------------ before and during a run
    @abstractmethod
    def rejection_codes(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """Per request, why it can never be served here (0: it can), from its lengths alone."""

    @abstractmethod
    def build(self, sim: Sim, reject_codes: np.ndarray) -> Built:
        """Create the replica loops, routers and links on ``sim``'s clock."""

    # ------------------------------------------------------------------ after a run
    def request_columns(self, sim: Sim) -> dict[str, np.ndarray]:
        """Extra per-request columns of this topology (appended to the request table)."""
        return {}

    def summary_sections(self, sim: Sim, built: Built, requests: pd.DataFrame, steps: pd.DataFrame,
                         span: float) -> dict[str, Any]:
        """Extra summary sections of this topology (after ``batch``)."""
        return {}

    def extra_tables(self, built: Built) -> dict[str, pd.DataFrame]:
        """Tables of this topology's own, written beside the run's (file name -> table)."""
        return {}

    def summary_lines(self, sections: dict[str, Any]) -> list[str]:
        """Lines for people about this topology's own summary sections (the CLI prints them)."""
        return []

    def resolved_deployment(self, deployment: dict[str, Any]) -> str:
        """Write the derived limits into the ``deployment`` section of a resolved config (in place);
        returns the header comment's text."""
        group = self.kv_group
        limits, memory = group.limits, group.memory
        for key, value in self.resolved_keys(group).items():
            deployment[key] = value
        unit = "replica" if group.units_per_replica == 1 else "scheduling unit (virtual engine x DP rank)"
        return (f"{limits.num_blocks:,} KV blocks of {limits.block_size} tokens per {unit} "
                f"({memory.kv_token_capacity:,} tokens, {memory.kv_cache_bytes / 2**30:.1f} GiB per GPU)")

    @staticmethod
    def resolved_keys(group: ReplicaGroup) -> dict[str, Any]:
        """The engine arguments a group ran with, as deployment keys (unset ones left out)."""
        return {key: value for key, value in asdict(group.settings).items() if value is not None}


TOPOLOGIES: dict[str, type[Topology]] = {}


def register_topology(cls: type[Topology]) -> type[Topology]:
    TOPOLOGIES[cls.kind] = cls
    return cls


def build_group(sim: Sim, group: ReplicaGroup, first_index: int,
                make_state: Callable[[int], ReplicaState],
                wrap_policy: Callable[[ReplicaState, Policy], Policy] | None = None,
                fast_forward: bool = False, sole_group: bool = False) -> GroupRun:
    """The replicas of ``group`` on ``sim``'s clock, indices from ``first_index``, each running its
    group's policy (wrapped by ``wrap_policy`` if given), with its own speculator when the group
    speculates, and sharing one cost model (its memo serves them all). Pipelined replicas (stages
    or DP ranks) get one state and policy per scheduling unit, numbered replica by replica, virtual
    engine by virtual engine, rank by rank. ``fast_forward``: the topology declares it
    (:attr:`Topology.fast_forward`); a replica then fast-forwards when the run asks for it, its
    engine and policy declare it too and its group does not speculate (proposals and their
    acceptance cannot be priced ahead) and, where requests are sent when others finish
    (:attr:`Sim.sends_at_run_time`), it is the sole replica; ``sole_group``: no other group's
    replicas take arrivals, so a group of one replica routes every arrival to it."""
    chunk_s = group.runtime.frontend_chunk_s
    if group.runs_pipeline:
        if chunk_s:
            raise ServesimError("engine.frontend_chunk_s", "the front end's streaming cost is modelled for "
                                "replicas of one scheduling unit, not pipeline stages or data-parallel "
                                "attention ranks", "leave it 0 (unset) for this deployment")
        if group.runtime.recv_interval > 1:
            raise ServesimError("engine.scheduler_recv_interval", "reading arrivals every n steps is "
                                "modelled for replicas of one scheduling unit (SGLang refuses it with "
                                "data-parallel attention), not pipeline stages or DP ranks",
                                "leave it 1 (unset) for this deployment")
        return _build_pipelined(sim, group, first_index, make_state, wrap_policy)
    cost = group.step_pricer()
    from servesim.core.replica import Replica  # here: resolving a plan (validate) builds no replica

    replicas: list[ServingUnit] = []
    for i in range(group.replicas):
        state = make_state(first_index + i)
        if group.speculation is not None:
            state.speculation = group.speculation.speculator(sim.seed)
        policy = group.policy.make(state)
        if wrap_policy is not None:
            policy = wrap_policy(state, policy)
        sole = sole_group and group.replicas == 1
        fast = (fast_forward and sim.fast_forward and group.engine.fast_forward
                and state.speculation is None and policy.fast_forward_ready()
                and (sole or not sim.sends_at_run_time))
        stream = open_stream(sim.requests.streams, state.index, chunk_s)
        replicas.append(Replica(sim.env, state, policy, cost, sim.steps,
                                next_arrival=sim.next_arrival if fast else None,
                                sole_replica=sole, horizon=sim.horizon, stream=stream,
                                schedule_ahead=group.runtime.schedule_ahead,
                                recv_interval=group.runtime.recv_interval))
    return GroupRun(group, replicas, first_index)


def _build_pipelined(sim: Sim, group: ReplicaGroup, first_index: int,
                     make_state: Callable[[int], ReplicaState],
                     wrap_policy: Callable[[ReplicaState, Policy], Policy] | None) -> GroupRun:
    from servesim.core.parallel_replica import ParallelReplica

    cost = group.parallel_cost_model()
    par = group.parallelism
    index = first_index
    units: list[ServingUnit] = []
    pipelines = []
    for _ in range(group.replicas):
        grid = []
        for _ in range(par.pp):
            ranks = []
            for _ in range(par.dp):
                state = make_state(index)
                if group.speculation is not None:  # each DP rank speculates on its own batch
                    state.speculation = group.speculation.speculator(sim.seed)
                policy = group.policy.make(state)
                if wrap_policy is not None:
                    policy = wrap_policy(state, policy)
                ranks.append((state, policy))
                index += 1
            grid.append(ranks)
        replica = ParallelReplica(sim.env, grid, cost, sim.steps, schedule_ahead=group.runtime.schedule_ahead,
                                  dp_balance=group.runtime.dp_balance)
        pipelines.append(replica)
        units.extend(replica.ranks)
    return GroupRun(group, units, first_index, pipelines)
