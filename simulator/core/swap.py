"""Host swap space: where a preempted request's KV blocks wait in CPU memory (vLLM v0's swapping).

vLLM v0 has two preemption modes. *Recompute* (its default) frees a victim's blocks and later
recomputes its whole context as one prefill. *Swap* copies the victim's blocks over PCIe into a
pinned host buffer of ``swap_space`` GiB per GPU (``--swap-space``, default 4 GiB) and copies
them back before it runs again, so the context is kept and no prefill is repeated; when the
buffer is full the victim is recomputed instead (vLLM v0 raises an error there; falling back is
what v1 and most forks do). The copies are issued by the worker before the model runs, on the
same stream (``CacheEngine.swap_in/out``), so they add to the step in which they happen.

Cost of one copy direction in one step: ``latency + bytes / (bandwidth * efficiency)`` over the
hardware profile's ``host_link`` (:meth:`~servesim.hardware.Link.transfer_s`; per GPU: each GPU of
a tensor-parallel group moves its own KV shard over its own link, in parallel). Byte counts
reported here are summed over the group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from servesim.core.kv_cache import BlockPool
from servesim.hardware import Link

GIB = float(1 << 30)


@dataclass(frozen=True)
class SwapPath:
    """What moving KV blocks between one replica's GPUs and host memory costs."""

    block_bytes: float
    """KV bytes of one block on one GPU (this GPU's shard of the heads)."""
    gpus: int
    """GPUs in the replica (tensor parallel): each copies its shard at the same time."""
    link: Link
    """Each GPU's host link (one direction)."""

    def seconds(self, blocks: int) -> float:
        """One direction's copy of ``blocks`` blocks (0 for none)."""
        return self.link.transfer_s(blocks * self.block_bytes) if blocks else 0.0

    def host_blocks(self, swap_space_gib: float) -> int:
        """Blocks that ``swap_space_gib`` GiB of host memory per GPU hold."""
        return math.floor(swap_space_gib * GIB / self.block_bytes)


class HostSwap:
    """One replica's host swap space, its traffic, and the copy time owed to the next step."""

    __slots__ = ("blocks_in", "blocks_out", "path", "pending_in", "pending_out", "pool",
                 "swaps_in", "swaps_out", "transfer_s")

    def __init__(self, path: SwapPath, swap_space_gib: float, num_requests: int) -> None:
        self.path = path
        self.pool = BlockPool(path.host_blocks(swap_space_gib), 1, num_requests)
        self.swaps_out = self.swaps_in = 0
        self.blocks_out = self.blocks_in = 0
        self.pending_out = self.pending_in = 0
        self.transfer_s = 0.0

    def holds(self, request: int) -> bool:
        return bool(self.pool.held[request])

    def swap_out(self, victims: np.ndarray, gpu_held: np.ndarray) -> np.ndarray:
        """Copy the victims' ``gpu_held`` blocks to host, in order, while they fit; returns the
        mask of those swapped (the others must be recomputed)."""
        swapped = np.zeros(victims.size, dtype=bool)
        for i, (request, blocks) in enumerate(zip(victims.tolist(), gpu_held.tolist(), strict=True)):
            if 0 < blocks <= self.pool.free:
                self.pool.grow(request, blocks)
                swapped[i] = True
                self.pending_out += blocks
        count = int(swapped.sum())
        self.swaps_out += count
        self.blocks_out += int(gpu_held[swapped].sum())
        return swapped

    def swap_in(self, requests: np.ndarray) -> np.ndarray:
        """Release the host copies of ``requests``; returns their block counts (for the GPU)."""
        blocks = self.pool.held[requests].copy()
        self.pool.release_many(requests)
        total = int(blocks.sum())
        self.pending_in += total
        self.blocks_in += total
        self.swaps_in += int(requests.size)
        return blocks

    def take_seconds(self) -> float:
        """The copy time owed by the step being formed (both directions), and reset it."""
        seconds = self.path.seconds(self.pending_out) + self.path.seconds(self.pending_in)
        self.pending_out = self.pending_in = 0
        self.transfer_s += seconds
        return seconds

    def bytes(self, blocks: int) -> float:
        """Bytes over all the replica's host links for ``blocks`` blocks."""
        return blocks * self.path.block_bytes * self.path.gpus
