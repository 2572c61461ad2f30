"""Requests released by completions: a session's next turn, an agent's next call, a join.

The arrival process (:func:`servesim.core.sim.arrivals`) sends every request at its table time.
A request that waits for others (the workload's ``links``, :mod:`servesim.workloads.links`) is
instead sent here, when the last request it waits for ends (completes, or is refused at arrival:
its client got an answer, an error, and carries on), ``delay_s`` later (a think time, a tool's
latency) and never before its own table time. This closes the loop per session: a slow answer
delays the next turn, so a session's load adapts to the service as real users do.

The mechanism is general: anything that can say "send request r when these end, this much later"
(closed-loop clients with a fixed concurrency included) fits it, and the arrival loop itself is
unchanged: :meth:`Releases.entry` wraps the topology's entry so that the arrival loop skips the
requests released here.

Every release is one SimPy timeout, like an arrival, so nothing here runs per step; finishes
arrive in NumPy batches and only requests that something waits for cost a Python loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import simpy

from servesim.core.front_end import enter_after
from servesim.core.state import REJECTED, RequestState
from servesim.workloads.links import RequestLinks
from servesim.workloads.requests import RequestTable

if TYPE_CHECKING:
    from servesim.core.sim import NextArrival

Send = Callable[[int, float], None]
"""Where a released request enters the deployment (the topology's ``entry``)."""


class Releases:
    """Counts down what each waiting request waits for and sends it when the count reaches 0."""

    def __init__(self, env: simpy.Environment, requests: RequestState, table: RequestTable,
                 links: RequestLinks, send: Send, latency_s: float = 0.0,
                 upcoming: NextArrival | None = None) -> None:
        """``upcoming``: where every release and every front-end crossing is announced when it is
        scheduled (the clock value of its event) and withdrawn when it happens, so that a
        fast-forwarding replica ends its runs before it (:class:`~servesim.core.sim.NextArrival`)."""
        self.env = env
        self.upcoming = upcoming
        self.latency_s = latency_s
        """The front end's latency: every request enters the deployment this long after it is sent."""
        self.requests = requests
        self.send = send
        self.earliest = table.arrival_s
        """The table's times: a request is never sent before its own."""
        self.delay = links.delay_s
        self.remaining = links.waits.copy()
        self.released_by_others = self.remaining > 0
        self.child_offsets, self.child_ids = links.children()
        self.has_children = np.diff(self.child_offsets) > 0
        self.released = 0
        requests.done_listeners.append(self.done)

    def entry(self, request: int, now: float) -> None:
        """The arrival loop's entry: requests that wait for others are sent by :meth:`done`."""
        if not self.released_by_others[request]:
            self._enter(request, now)

    def done(self, ids: np.ndarray, now: float) -> None:
        """``ids`` ended at ``now``: count them off for the requests waiting for them."""
        waited_for = ids[self.has_children[ids]] if ids.size > 1 else (
            ids if self.has_children[int(ids[0])] else ids[:0])
        for request in waited_for.tolist():
            start, stop = self.child_offsets[request], self.child_offsets[request + 1]
            for child in self.child_ids[start:stop].tolist():
                self.remaining[child] -= 1
                if self.remaining[child] == 0:
                    self._schedule(child, now)

    # ------------------------------------------------------------------ internals
    def _schedule(self, child: int, now: float) -> None:
        at = max(float(self.earliest[child]), now + float(self.delay[child]))
        delay = at - now
        if now + delay < at:  # never before ``at`` by rounding (as the arrival loop)
            delay = math.nextafter(delay, math.inf)
        timer = self.env.timeout(delay)
        if self.upcoming is not None:
            self.upcoming.expect(self.env.now + delay)  # the timeout lands there
        timer.callbacks.append(partial(self._fire, child))

    def _fire(self, request: int, _: simpy.Event) -> None:
        now = self.env.now
        if self.upcoming is not None:
            self.upcoming.entered(now)
        self.requests.arrival[request] = now
        self.released += 1
        self._enter(request, now)

    def _enter(self, request: int, now: float) -> None:
        enter_after(self.env, self.latency_s, self._send, request, self.upcoming)

    def _send(self, request: int, now: float) -> None:
        """A request that crossed the front end enters the deployment (and may be refused)."""
        self.send(request, now)
        if self.requests.status[request] == REJECTED:  # refused at the door: its client carries on
            self.done(np.array([request], dtype=np.int64), now)
