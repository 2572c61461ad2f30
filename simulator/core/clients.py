"""Clients whose next request waits for their previous one: closed-loop load.

Most published engine benchmarks drive the server this way: ``vllm bench serve
--max-concurrency N``, ``aiperf --concurrency N``, GuideLLM's concurrent mode and
``trtllm-bench`` keep N requests in flight; each client sends its next request as soon as its
previous one completes (after a think time, if any). The arrival times are therefore not known
before the run: :class:`Clients` writes each request's arrival into the request state at the
moment it is sent, and the metrics read them from there as for any other run.

A client that sends its next request when its previous one finishes is also what a multi-turn
session is (the next turn follows the previous answer), so the hooks are general: which request
a client sends next (:meth:`Clients.next_request`) and how long it thinks first
(:meth:`Clients.think_s`). The closed loop takes the table's requests in order, whoever is free,
and thinks a fixed time. A rejected request counts as answered at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import simpy

from servesim.core.front_end import enter_after
from servesim.core.state import REJECTED, RequestState

if TYPE_CHECKING:
    from servesim.core.sim import NextArrival

Entry = Callable[[int, float], None]


@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` clients, each waiting ``think_time_s`` after an answer before asking again."""

    concurrency: int
    think_time_s: float = 0.0


class Clients:
    """Sends requests into ``entry`` on behalf of a fixed set of clients (see the module docstring)."""

    def __init__(self, env: simpy.Environment, requests: RequestState, entry: Entry,
                 loop: ClosedLoop, latency_s: float = 0.0, upcoming: NextArrival | None = None) -> None:
        """``upcoming``: where the clients announce when a request may enter next, so that a
        fast-forwarding replica ends its runs before it (:class:`~servesim.core.sim.NextArrival`);
        every time announced is the clock value of the event that sends or enters the request."""
        self.env = env
        self.requests = requests
        self.entry = entry
        self.loop = loop
        self.latency_s = latency_s
        """The front end's latency: a request enters the deployment this long after it is sent."""
        self._next = 0
        self._client_of = np.full(len(requests), -1, dtype=np.int64)
        self._ready: deque[int] = deque()
        self._sending = False
        self.upcoming = upcoming
        # Arrival times are written as requests are sent: never into the workload's own table.
        requests.arrival = np.zeros(len(requests), dtype=np.float64)
        requests.done_listeners.append(self.done)

    def next_request(self, client: int) -> int | None:
        """The request ``client`` sends next (None: it has nothing left to send)."""
        if self._next >= len(self.requests):
            return None
        request = self._next
        self._next += 1
        return request

    def think_s(self, client: int, answered: int) -> float:
        """How long ``client`` waits after request ``answered`` completes before sending again."""
        return self.loop.think_time_s

    def start(self) -> None:
        """Every client sends its first request at t = 0, in client order."""
        self._ready.extend(range(self.loop.concurrency))
        self._drain()

    def done(self, ids: np.ndarray, now: float) -> None:
        """Requests ``ids`` completed (or were refused) at ``now``: their clients go on."""
        streams = self.requests.streams
        for request in ids.tolist():
            client = int(self._client_of[request])
            if client < 0:
                continue
            wait = self.think_s(client, request)
            if streams and self.requests.status[request] != REJECTED:
                # the client sees its last token when the front end has sent it
                wait += streams[int(self.requests.replica[request])].lag
            if wait > 0:
                if self.upcoming is not None:  # the earliest its next request could enter
                    self.upcoming.expect(self.env.now + wait)  # the timeout _after yields
                self.env.process(self._after(wait, client))
            else:
                self._ready.append(client)
        self._drain()

    def _after(self, wait: float, client: int) -> Generator[simpy.Event, object, None]:
        yield self.env.timeout(wait)
        if self.upcoming is not None:  # a request it sends now is announced by _drain
            self.upcoming.entered(self.env.now)
        self._ready.append(client)
        self._drain()

    def _drain(self) -> None:
        """Send for every ready client. A refused request is answered inside ``entry`` and makes
        its client ready again; the loop (not recursion) sends its next one."""
        if self._sending:
            return
        self._sending = True
        try:
            ready, now = self._ready, self.env.now
            while ready:
                client = ready.popleft()
                request = self.next_request(client)
                if request is None:
                    continue
                self._client_of[request] = client
                self.requests.arrival[request] = now
                enter_after(self.env, self.latency_s, self._enter, request, self.upcoming)
        finally:
            self._sending = False

    def _enter(self, request: int, now: float) -> None:
        """A request that crossed the front end enters the deployment (and may be refused)."""
        self.entry(request, now)
        if self.requests.status[request] == REJECTED:  # refused at the door: answered now
            self.done(np.array([request], dtype=np.int64), now)
