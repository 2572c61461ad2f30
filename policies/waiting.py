"""A waiting queue served in order of a per-request key instead of arrival.

It offers the few deque methods the engine and the policies use (``append``, ``extendleft``,
``popleft``, ``[0]``, ``len``), so a policy installs it in place of the replica's FCFS deque and
the admission loop of :class:`~servesim.policies.continuous.ContinuousBatching` runs unchanged. It is a
binary heap of ``(key, request id)``: O(log n) per arrival and per admission, however many
requests wait, and ties go to the lower id, i.e. the earlier arrival (tables are sorted by
arrival). Keys are fixed per request (an aging term that grows with waiting time is folded into
the key; see :mod:`servesim.policies.sjf`), so the heap never needs re-sorting. A preempted request goes
back in under its own key, as in vLLM's priority scheduler, rather than to the front.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

import numpy as np


class KeyedQueue:
    """Requests ordered by ``keys[request]`` (smaller first), then by request id."""

    __slots__ = ("_heap", "_keys")

    def __init__(self, keys: np.ndarray) -> None:
        self._keys = np.asarray(keys, dtype=np.float64).tolist()  # Python floats: fast to index
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __getitem__(self, index: int) -> int:
        if index != 0:
            raise IndexError("a keyed queue only shows its head ([0])")
        return self._heap[0][1]

    def __iter__(self) -> Iterator[int]:
        """The waiting requests in service order, lazily: the first k cost O(k log k), not a sort
        of the whole heap, so an admission loop that stops early stays cheap. It walks the heap
        as a tree (a node's children never come before it) with a small frontier heap."""
        heap = self._heap
        if not heap:
            return
        frontier = [(heap[0], 0)]
        size = len(heap)
        while frontier:
            (_, request), node = heapq.heappop(frontier)
            yield request
            for child in (2 * node + 1, 2 * node + 2):
                if child < size:
                    heapq.heappush(frontier, (heap[child], child))

    def append(self, request: int) -> None:
        heapq.heappush(self._heap, (self._keys[request], request))

    def extendleft(self, requests: Iterable[int]) -> None:
        """Put back (preempted) requests: each goes where its key places it."""
        for request in requests:
            heapq.heappush(self._heap, (self._keys[request], request))

    def popleft(self) -> int:
        return heapq.heappop(self._heap)[1]
