"""The paged KV cache of one replica: a pool of fixed-size blocks and who holds how many.

As in vLLM, the cache is carved into blocks of ``block_size`` tokens; a request holds
``ceil(tokens / block_size)`` blocks for the tokens whose KV it has computed (or is computing in
the current step), grows one block at a time as it decodes, and gives all of them back when it
finishes or is preempted. Without prefix sharing blocks are interchangeable, so the pool only
counts them: per request (one array over all requests) and in total. The interface is small on
purpose (``blocks_to_grow``, ``grow``, ``release``) so that a prefix-caching pool can replace it.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

Tokens = TypeVar("Tokens", int, np.ndarray)


def blocks_for(tokens: Tokens, block_size: int, plus: int = 0) -> Tokens:
    """KV blocks of ``block_size`` tokens that hold ``tokens + plus`` tokens (element-wise for an
    array; ``plus`` saves an array operation on the engine's hot path, e.g. the slot of the token a
    decode step adds). The one spelling of this rounding in servesim."""
    return (tokens + (block_size - 1 + plus)) // block_size


class BlockPool:
    """``total`` blocks of ``block_size`` tokens; ``held[r]`` blocks belong to request ``r``."""

    __slots__ = ("block_size", "free", "held", "peak_used", "total")

    def __init__(self, total_blocks: int, block_size: int, num_requests: int,
                 held: np.ndarray | None = None) -> None:
        self.total = int(total_blocks)
        self.block_size = int(block_size)
        self.free = self.total
        # A request lives on one replica, so the replicas' pools can share one ``held`` column.
        self.held = np.zeros(num_requests, dtype=np.int64) if held is None else held
        self.peak_used = 0

    @property
    def used(self) -> int:
        return self.total - self.free

    def blocks_for(self, tokens: int) -> int:
        """Blocks of this pool that hold ``tokens`` tokens."""
        return blocks_for(int(tokens), self.block_size)

    def blocks_to_grow(self, request: int, tokens: int) -> int:
        """Extra blocks request ``request`` needs to hold ``tokens`` tokens."""
        return max(0, blocks_for(int(tokens), self.block_size) - int(self.held[request]))

    def grow(self, request: int, blocks: int) -> None:
        self.held[request] += blocks
        self.free -= blocks
        if self.total - self.free > self.peak_used:
            self.peak_used = self.total - self.free

    def grow_many(self, requests: np.ndarray, blocks: np.ndarray, total: int) -> None:
        """Add ``blocks[i]`` to ``requests[i]`` (distinct ids); ``total`` is ``blocks.sum()``."""
        if total:
            self.held[requests] += blocks
            self.free -= total
            if self.total - self.free > self.peak_used:
                self.peak_used = self.total - self.free

    def shrink_many(self, requests: np.ndarray, keep: np.ndarray) -> None:
        """Give back the blocks of ``requests[i]`` (distinct ids) beyond its first ``keep[i]``:
        the slots of speculative proposals the target rejected. Those are the request's newest
        blocks, never shared."""
        excess = self.held[requests] - keep
        freed = int(excess[excess > 0].sum())
        if freed:
            self.held[requests] = np.minimum(self.held[requests], keep)
            self.free += freed

    def release(self, request: int) -> int:
        """Free every block of ``request``; returns how many."""
        blocks = int(self.held[request])
        self.held[request] = 0
        self.free += blocks
        return blocks

    def release_many(self, requests: np.ndarray) -> None:
        if requests.size:
            self.free += int(self.held[requests].sum())
            self.held[requests] = 0
