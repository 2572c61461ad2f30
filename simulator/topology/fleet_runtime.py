"""A fleet on the clock: replica slots that come and go, the live set the router sees, and the
timeline that GPU-hours are integrated over.

Each group owns a fixed number of *slots* (its ``replicas``, or ``max_replicas`` when autoscaled),
each with a fixed replica index, so the step table, ``requests.parquet``'s ``replica`` column and
the per-group summaries read alike for fixed and autoscaled groups. A slot is in one of four
states:

- ``inactive``: no replica; not billed.
- ``provisioning``: asked for, cold-starting (:func:`~servesim.topology.fleet_keys.cold_start_s`):
  billed, serves nothing.
- ``ready``: a live replica; the router sends it requests.
- ``draining``: asked to go; the router no longer sees it, it finishes what it holds (waiting
  and running requests), then becomes inactive. Billed until then.

A slot that becomes ready again gets a fresh replica (empty KV cache and queues, as a new pod
would); the one it replaces had drained and sits idle forever, costing nothing. Requests that no
live replica can take (every eligible group scaled to zero, or still cold-starting) are held at
the fleet's door, as Knative's activator holds them, and routed when a replica becomes ready.

The timeline records every change of a group's (ready, provisioning, draining) counts; GPU-hours
are its exact integral: the sum over constant stretches of (ready + provisioning + draining) x
GPUs per replica x the stretch's length / 3600.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import simpy

from servesim.core.replica import Replica, ServingUnit
from servesim.core.replica_state import ReplicaState
from servesim.core.sim import Sim
from servesim.core.state import REJECTED, RUNNING
from servesim.core.stream_out import open_stream
from servesim.cost import BatchShape
from servesim.policies.fleet_routers import FleetRouter
from servesim.policies.routers import Router, RouterChoice
from servesim.topology.base import GroupRun
from servesim.topology.group import ReplicaGroup

if TYPE_CHECKING:
    import pandas as pd  # a plan (validate) loads no table library

INACTIVE, PROVISIONING, READY, DRAINING = "inactive", "provisioning", "ready", "draining"
TIMELINE_COLUMNS = ("time_s", "group", "ready", "provisioning", "draining", "gpus")


@dataclass
class Slot:
    index: int
    group: int
    state: str = INACTIVE
    replica: Replica | None = None
    used: bool = False
    """Whether a replica has run in this slot (a reactivation then starts a fresh one)."""
    generation: int = 0
    """Bumped when a pending cold start is cancelled, so its timer is ignored."""
    since: float = 0.0


@dataclass
class GroupPlan:
    """What the runtime needs of a group: the resolved group, its slots and cold start."""

    group: ReplicaGroup
    first_index: int
    slots: int
    initial: int
    cold_start_s: float
    speed: float = 1.0


@dataclass
class FleetRuntime:
    """The fleet's replicas on ``sim``'s clock (see the module docstring)."""

    sim: Sim
    plans: list[GroupPlan]
    make_state: Callable[[ReplicaGroup, int], ReplicaState]
    router_choice: RouterChoice
    eligible: np.ndarray
    """(groups x requests) bool: the group could ever serve the request."""
    slots: list[Slot] = field(default_factory=list)
    runs: list[GroupRun] = field(default_factory=list)
    live: list[ReplicaState] = field(default_factory=list)
    live_replicas: list[Replica] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    timeline: list[tuple[float, str, int, int, int, int]] = field(default_factory=list)
    router: Router | None = None
    settled: int = 0
    """Requests finished or refused so far (the autoscaler stops when all are)."""
    listeners: list[Callable[[np.ndarray, float], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        env = self.sim.env
        self._group_index = {plan.group.name: g for g, plan in enumerate(self.plans)}
        self._costs = [plan.group.cost_model() for plan in self.plans]
        self._slot_group = np.zeros(sum(plan.slots for plan in self.plans), dtype=np.int64)
        for g, plan in enumerate(self.plans):
            replicas: list[ServingUnit] = []
            for k in range(plan.slots):
                slot = Slot(plan.first_index + k, g)
                slot.replica = self._new_replica(slot)
                replicas.append(slot.replica)
                self.slots.append(slot)
                self._slot_group[slot.index] = g
            self.runs.append(GroupRun(plan.group, replicas, plan.first_index))
        for g, plan in enumerate(self.plans):
            for slot in self.group_slots(g)[:plan.initial]:
                self._set(slot, READY, 0.0)
        self._refresh_live()
        for g in range(len(self.plans)):
            self._record(g, 0.0)
        self.sim.requests.done_listeners.append(self._done)
        _ = env

    # ------------------------------------------------------------------ the fleet view (routers)
    def group_of(self, replica: ReplicaState) -> str:
        return self.plans[int(self._slot_group[replica.index])].group.name

    def speed_of(self, replica: ReplicaState) -> float:
        return self.plans[int(self._slot_group[replica.index])].speed

    def group_names(self) -> list[str]:
        return [plan.group.name for plan in self.plans]

    # ------------------------------------------------------------------ arrivals
    def entry(self, request: int, now: float) -> None:
        """Route an arriving request to a live replica that can serve it, or hold it."""
        live = self.live
        if not live:
            self._hold(request)
            return
        assert self.router is not None
        choice = self.router.route(request, now)
        state = live[choice]
        eligible = self.eligible[:, request]
        if not eligible[self._slot_group[state.index]]:
            candidates = [i for i, s in enumerate(live) if eligible[self._slot_group[s.index]]]
            if candidates:
                choice = min(candidates, key=lambda i: live[i].outstanding)
            elif eligible.any():  # only groups with no live replica could serve it: wait for one
                self._hold(request)
                return
        self.live_replicas[choice].accept(request)
        if self.sim.requests.status[request] == REJECTED:
            self.settled += 1

    def _hold(self, request: int) -> None:
        self.held.append(request)

    def _release_held(self, now: float) -> None:
        held, self.held = self.held, []
        for request in held:
            self.entry(request, now)

    # ------------------------------------------------------------------ scaling
    def group_slots(self, g: int) -> list[Slot]:
        first = self.plans[g].first_index
        return self.slots[first:first + self.plans[g].slots]

    def counts(self, g: int) -> dict[str, int]:
        out = {INACTIVE: 0, PROVISIONING: 0, READY: 0, DRAINING: 0}
        for slot in self.group_slots(g):
            out[slot.state] += 1
        return out

    def scale_up(self, g: int, count: int, now: float) -> int:
        """Ask for ``count`` more replicas of group ``g`` (inactive slots, lowest first); each is
        ready ``cold_start_s`` later. Returns how many were started."""
        started = 0
        for slot in self.group_slots(g):
            if started == count:
                break
            if slot.state != INACTIVE:
                continue
            self._set(slot, PROVISIONING, now)
            timer = self.sim.env.timeout(self.plans[g].cold_start_s)
            timer.callbacks.append(partial(self._ready, slot, slot.generation))
            started += 1
        if started:
            self._record(g, now)
        return started

    def scale_down(self, g: int, count: int, now: float) -> int:
        """Remove ``count`` replicas of group ``g``: cold starts in progress are cancelled first
        (the latest asked for), then ready replicas drain, those holding the fewest requests
        first (ties: the highest index). Returns how many were removed."""
        removed = 0
        slots = self.group_slots(g)
        for slot in sorted((s for s in slots if s.state == PROVISIONING), key=lambda s: -s.since):
            if removed == count:
                break
            slot.generation += 1
            self._set(slot, INACTIVE, now)
            removed += 1
        ready = sorted((s for s in slots if s.state == READY),
                       key=lambda s: (s.replica.state.outstanding if s.replica else 0, -s.index))
        drained = False
        for slot in ready[:max(count - removed, 0)]:
            self._set(slot, DRAINING, now)
            if self._empty(slot):
                self._set(slot, INACTIVE, now)
            removed += 1
            drained = True
        if drained:
            self._refresh_live()
        if removed:
            self._record(g, now)
        return removed

    def _ready(self, slot: Slot, generation: int, _: simpy.Event) -> None:
        if slot.generation != generation or slot.state != PROVISIONING:
            return  # cancelled while it was cold-starting
        now = self.sim.env.now
        if slot.used:
            old = slot.replica
            slot.replica = self._new_replica(slot, old)
            self.runs[slot.group].replicas[slot.index - self.plans[slot.group].first_index] = slot.replica
        self._set(slot, READY, now)
        self._refresh_live()
        self._record(slot.group, now)
        self._release_held(now)

    def _done(self, ids: np.ndarray, now: float) -> None:
        self.settled += int(ids.size)
        for listener in self.listeners:
            listener(ids, now)
        if not any(slot.state == DRAINING for slot in self.slots):
            return
        changed = set()
        for slot in self.slots:
            if slot.state == DRAINING and self._empty(slot):
                self._set(slot, INACTIVE, now)
                changed.add(slot.group)
        for g in sorted(changed):
            self._record(g, now)

    def _empty(self, slot: Slot) -> bool:
        """Nothing waits or runs on the slot's replica (finishing requests are still in its
        running set when the step's finishes are announced, so check their status)."""
        assert slot.replica is not None
        state = slot.replica.state
        if state.queued:
            return False
        running = state.running
        return not running.size or not np.any(self.sim.requests.status[running] == RUNNING)

    # ------------------------------------------------------------------ internals
    def _new_replica(self, slot: Slot, previous: Replica | None = None) -> Replica:
        plan = self.plans[slot.group]
        state = self.make_state(plan.group, slot.index)
        if previous is not None:  # counters that span the slot's replicas
            state.pool.peak_used = previous.state.pool.peak_used
            if state.prefix_cache is not None and previous.state.prefix_cache is not None:
                state.prefix_cache.evicted_blocks = previous.state.prefix_cache.evicted_blocks
        policy = plan.group.policy.make(state)
        stream = open_stream(self.sim.requests.streams, state.index, plan.group.runtime.frontend_chunk_s)
        return Replica(self.sim.env, state, policy, self._costs[slot.group], self.sim.steps, stream=stream,
                       schedule_ahead=plan.group.runtime.schedule_ahead,
                       recv_interval=plan.group.runtime.recv_interval)

    def _set(self, slot: Slot, state: str, now: float) -> None:
        if state == READY:
            slot.used = True
        slot.state = state
        slot.since = now

    def _refresh_live(self) -> None:
        ready = [slot for slot in self.slots if slot.state == READY]
        self.live_replicas = [slot.replica for slot in ready if slot.replica is not None]
        self.live = [replica.state for replica in self.live_replicas]
        self.router = self.router_choice.make(self.live) if self.live else None
        if isinstance(self.router, FleetRouter):
            self.router.bind(self)

    def _record(self, g: int, now: float) -> None:
        counts = self.counts(g)
        plan = self.plans[g]
        billed = counts[READY] + counts[PROVISIONING] + counts[DRAINING]
        row = (now, plan.group.name, counts[READY], counts[PROVISIONING], counts[DRAINING],
               billed * plan.group.parallelism.gpus_per_replica)
        if self.timeline and self.timeline[-1][1] == row[1] and self.timeline[-1][0] == now:
            self.timeline[-1] = row  # several changes at one instant: the last counts
        else:
            self.timeline.append(row)

    def timeline_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.timeline, columns=list(TIMELINE_COLUMNS))


def relative_speeds(groups: list[ReplicaGroup]) -> list[float]:
    """Each group's decode throughput relative to the fastest: one decode step of 32 requests over
    1,024 tokens of context, priced by each group's cost model (what ``speed_weighted`` reads)."""
    reference = BatchShape.decode(32, 1024)
    rates = [32 / group.cost_model().step_time(reference) for group in groups]
    fastest = max(rates)
    return [rate / fastest for rate in rates]


def gpu_hours(timeline: pd.DataFrame, horizon_s: float) -> dict[str, float]:
    """GPU-hours of each group over ``[0, horizon_s]``: the exact integral of its billed GPUs."""
    out: dict[str, float] = {}
    for name, rows in timeline.groupby("group", sort=False):
        times = np.append(rows["time_s"].to_numpy(dtype=float), horizon_s)
        times = np.minimum(times, horizon_s)
        out[str(name)] = float(np.sum(np.diff(times) * rows["gpus"].to_numpy(dtype=float)) / 3600.0)
    return out
