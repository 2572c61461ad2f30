"""The objects one simulation shares, and its clock: arrivals and the run loop.

A topology builds its replicas, routers and links onto a :class:`Sim` and hands back an entry
point (``entry(request, now)``: route an arrival); :func:`arrivals` walks the request table and
calls it, one SimPy timeout per arrival; :func:`run_until_done` runs the clock until nothing is
left to happen (closed-loop clients instead send each request when their previous one is done).
Nothing here is random: the workload's seed fixes the table, and the same table
and config give the same results, bit for bit.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import simpy

from servesim.core.clients import Clients, ClosedLoop
from servesim.core.state import DONE, REJECTED, RequestState
from servesim.core.step_log import StepLog

if TYPE_CHECKING:
    from servesim.workloads.requests import RequestTable

Progress = Callable[[int, int, float], None]
"""Called now and then with (requests finished or rejected, total requests, simulated time)."""

Entry = Callable[[int, float], None]
"""Where an arriving request enters the deployment: ``entry(request, now)``."""


class NextArrival:
    """When the next request enters the deployment (the clock value of its arrival event; 0 before
    the arrivals start, infinity after the last). A fast-forwarding replica ends its runs strictly
    before it, since a router may read the replica's state then.

    Two sources: the arrival loop keeps :attr:`at` at the table's next entry, and requests sent at
    run time (closed-loop clients, :mod:`servesim.core.clients`) announce theirs with
    :meth:`expect` when they are sent and withdraw it with :meth:`entered` when they enter. Where a
    sender cannot yet know whether a request will follow (a client thinking), it announces the
    earliest time one could enter instead: an earlier bound only ends runs sooner, never changes
    a result."""

    __slots__ = ("_pending", "at")

    def __init__(self) -> None:
        self.at = 0.0
        self._pending: list[float] = []

    def __call__(self) -> float:
        pending = self._pending
        return pending[0] if pending and pending[0] < self.at else self.at

    def expect(self, at: float) -> None:
        """Something may enter the deployment at ``at`` (the clock value of its event)."""
        heapq.heappush(self._pending, at)

    def entered(self, at: float) -> None:
        """The entry announced for ``at`` happened (or will not): withdraw it."""
        pending = self._pending
        if pending[0] == at:
            heapq.heappop(pending)
        else:
            pending.remove(at)
            heapq.heapify(pending)


class Horizon:
    """The next time something outside the replicas reads their requests' state between events
    (infinity: never before the run ends). ``SlicedSimulation`` sets it to each slice's end, where
    the capacity planner reads what is certain so far; a fast-forwarding replica credits runs that
    go on through a request's finish before their single timeout ends, so it keeps every such run
    strictly before the horizon (``Replica``: a run chained through finishes)."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = math.inf

    def __call__(self) -> float:
        return self.at


@dataclass
class Sim:
    """One simulation's clock, request state and step log, shared by every replica."""

    env: simpy.Environment
    requests: RequestState
    steps: StepLog
    workload: RequestTable
    seed: int
    fast_forward: bool = False
    """Replicas whose topology, engine and policy declare it may run pure-decode iterations in
    bulk (``servesim.core.fast_forward``); False is the step-by-step reference mode."""
    next_arrival: NextArrival = field(default_factory=NextArrival)
    horizon: Horizon = field(default_factory=Horizon)
    sends_at_run_time: bool = False
    """Requests are sent when others finish (closed-loop clients, requests released by
    completions), so an entry is only announced to :class:`NextArrival` once the finish that sends
    it has happened: only a replica whose own finishes are the only ones (the deployment's sole
    replica) can plan its runs around every entry; others run step by step."""

    @classmethod
    def start(cls, workload: RequestTable, seed: int, fast_forward: bool = False,
              closed_loop: bool = False) -> Sim:
        """``fast_forward``: replicas may run pure-decode iterations in bulk. Requests sent at
        times the arrival table does not hold (``closed_loop`` clients, requests released by
        completions) announce their entries to :class:`NextArrival`, which bounds the runs of a
        sole replica (:attr:`sends_at_run_time`)."""
        return cls(simpy.Environment(), RequestState(workload), StepLog(), workload, seed, fast_forward,
                   sends_at_run_time=closed_loop or workload.links is not None)


def arrivals(env: simpy.Environment, workload: RequestTable, entry: Entry,
             next_arrival: NextArrival | None = None,
             latency_s: float = 0.0) -> Generator[simpy.Event, object, None]:
    """Hand each request to ``entry`` at its arrival time plus the front end's ``latency_s``, in
    table order (keeping ``next_arrival`` at the next one's event time). The request keeps its
    table time as its arrival: the client sent it then, and its latencies count from there."""
    upcoming = NextArrival() if next_arrival is None else next_arrival
    times = workload.arrival_s if latency_s == 0.0 else workload.arrival_s + latency_s
    for request, at in enumerate(times.tolist()):
        if at > env.now:
            # now + (at - now) can round one ulp below ``at``; step up so that the clock never
            # runs before a trace's arrival time (else a queueing delay of -1e-17 s appears).
            delay = at - env.now
            if env.now + delay < at:
                delay = math.nextafter(delay, math.inf)
            upcoming.at = env.now + delay
            yield env.timeout(delay)
        entry(request, env.now)
    upcoming.at = math.inf


def run_until_done(sim: Sim, entry: Entry, progress: Progress | None,
                   closed_loop: ClosedLoop | None = None, latency_s: float = 0.0) -> None:
    """Feed the workload into ``entry`` and run until every request is finished or refused (the
    event queue then empties). Requests that wait for others (sessions, agent chains) are sent
    by :class:`~servesim.core.release.Releases` when those end, not by the arrival loop.
    ``closed_loop``: clients send the requests, each its next one when its previous one is done
    (:mod:`servesim.core.clients`), instead of at the table's times (the workload schema refuses
    closed loops of sessions or workflows, which are closed loops already). ``latency_s``: the
    engine front end's latency per request (:attr:`~servesim.engines.base.CpuCosts.frontend_s`),
    between a client's send and the request's entry into the deployment."""
    start_run(sim, entry, progress, closed_loop, latency_s)
    sim.env.run()


def start_run(sim: Sim, entry: Entry, progress: Progress | None,
              closed_loop: ClosedLoop | None = None, latency_s: float = 0.0) -> None:
    """Everything :func:`run_until_done` does before it runs the clock: start the arrivals (or
    the clients) and the progress monitor. A caller that runs the clock in slices
    (``env.run(until=...)``, e.g. the capacity planner stopping a probe whose verdict is settled)
    starts the run with this; slicing only reads state between events, so it changes nothing."""
    links = sim.workload.links
    if closed_loop is not None:
        sim.next_arrival.at = math.inf  # no table arrivals: only the clients' announced entries
        Clients(sim.env, sim.requests, entry, closed_loop, latency_s, sim.next_arrival).start()
    elif links is not None:
        from servesim.core.release import Releases

        # the releases delay every request they send, the arrival loop's included
        entry = Releases(sim.env, sim.requests, sim.workload, links, entry, latency_s, sim.next_arrival).entry
        sim.env.process(arrivals(sim.env, sim.workload, entry, sim.next_arrival))
    else:
        sim.env.process(arrivals(sim.env, sim.workload, entry, sim.next_arrival, latency_s))
    if progress is not None:
        sim.env.process(_monitor(sim.env, sim.requests, progress,
                                 every_s=max(1.0, sim.workload.duration_s / 200)))


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
