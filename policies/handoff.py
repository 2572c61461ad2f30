"""Decisions of disaggregated serving: which decode replica takes a prefilled request, and when
a decode replica takes in its KV.

Follows Splitwise (Patel et al., ISCA 2024), DistServe (Zhong et al., OSDI 2024) and vLLM's
disaggregated prefill (a proxy in front of a prefill and a decode instance, KV moved by the NIXL
connector). A prompt runs on a prefill replica and emits nothing there; its KV stays in the
prefill replica's blocks until it has been copied out. A decode replica, chosen when the prefill
finishes (:class:`LeastKvLoad`, or any router), pulls the KV when it has room for it (DistServe's
decode instances pull; vLLM's decode scheduler allocates the blocks of a request in state
``WAITING_FOR_REMOTE_KVS`` before the connector loads into them): blocks are reserved on the decode
side first (:class:`KvReceiver`), then the copy goes over the link, then the request joins the
decode replica's running set with no prefill compute and decodes the rest under that group's
policy. The mechanism (the link, the landing) is :mod:`servesim.topology.disaggregated`.

The admission rule for transfers is continuous batching's rule for a new prompt: first come first
served, within ``max_num_seqs`` (counting transfers in flight as seats) and keeping the free-block
watermark (waived when nothing runs or lands), and never ahead of a request that was preempted
here (vLLM keeps both in one waiting queue, preempted requests at its front).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from servesim.policies.base import Batch, Policy

if TYPE_CHECKING:  # the core runs policies; policies only name its types
    from servesim.core.replica_state import ReplicaState


class KvReceiver(Policy):
    """A decode replica's policy, wrapped: it takes in prefilled requests as blocks allow.

    ``offer`` queues a request whose prefill finished elsewhere; at each of the replica's
    scheduling points, after its own policy has formed the step (so the running requests' growth
    is served first, as in vLLM), the head of that queue gets the blocks for its prompt's KV and
    ``start_transfer`` is called for it. It joins ``running`` when the engine lands it.
    """

    name = "kv_receiver"

    def __init__(self, replica: ReplicaState, inner: Policy,
                 start_transfer: Callable[[int, float], None]) -> None:
        super().__init__(replica, inner.options)
        self.inner = inner
        self.start_transfer = start_transfer
        self.incoming: deque[int] = deque()
        self.incoming_blocks = 0
        """KV blocks the queued (not yet reserved) requests will need: load for the router."""
        self.in_flight = 0
        """Requests with blocks reserved here whose KV has not landed yet."""

    def offer(self, request: int) -> None:
        self.incoming.append(request)
        self.incoming_blocks += self._need(request)

    def landed(self, count: int = 1) -> None:
        self.in_flight -= count

    def schedule(self, now: float) -> Batch | None:
        batch = self.inner.schedule(now)
        if self.incoming and not self.replica.waiting:
            self._reserve(now)
        return batch

    def after_step(self, batch: Batch, finished: np.ndarray, now: float) -> None:
        self.inner.after_step(batch, finished, now)

    def wake_at(self, now: float) -> float | None:
        return self.inner.wake_at(now)

    def _need(self, request: int) -> int:
        return self.replica.pool.blocks_for(int(self.replica.requests.prompt[request]))

    def _reserve(self, now: float) -> None:
        replica, pool = self.replica, self.replica.pool
        # Transfers in flight hold seats and blocks like running requests (the watermark applies).
        room = replica.admission_room()
        room.seats -= self.in_flight
        if self.in_flight:
            room.reserve = room.watermark
        while self.incoming and room.seats > 0:
            request = self.incoming[0]
            need = self._need(request)
            if not room.blocks_fit(need):
                return
            self.incoming.popleft()
            self.incoming_blocks -= need
            pool.grow(request, need)
            self.in_flight += 1
            room.take(0, need)
            self.start_transfer(request, now)


class LeastKvLoad:
    """The decode replica with the smallest fraction of KV blocks taken, counting blocks
    reserved for transfers in flight and those its queued transfers will need; ties go to the
    lowest index. KV, not request count, is what limits a decode replica's batch (DistServe
    places decode work by memory)."""

    def __init__(self, receivers: list[KvReceiver]) -> None:
        self.receivers = receivers

    def route(self, request: int, now: float) -> int:
        best, best_load = 0, float("inf")
        for i, receiver in enumerate(self.receivers):
            pool = receiver.replica.pool
            load = (pool.total - pool.free + receiver.incoming_blocks) / pool.total
            if load < best_load:
                best, best_load = i, load
        return best
